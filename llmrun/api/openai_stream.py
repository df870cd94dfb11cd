"""OpenAI's streamed answers as chunks (pure): the events of a call's requests in, chunk objects out.

A chat stream opens with each choice's role, then sends text deltas (a reasoning model's reasoning as
``reasoning_content`` deltas), each choice's ``finish_reason`` when its Result comes, and the usage
chunk when the client asked for it. With tools, text is held until it is clear it is not a call; a
call's id and name are sent as soon as its name is written and its arguments in fragments as they are
generated, as OpenAI streams them. The server frames these as server-sent events.
"""

from __future__ import annotations

from typing import Any

from llmrun.api.openai import Call, finish_reason, usage
from llmrun.api.openai_tools import tool_call_deltas
from llmrun.decoding.events import Token
from llmrun.engine.request import Request
from llmrun.engine.result import Result
from llmrun.structured.callstream import CallStart, CallStream
from llmrun.structured.dialects import Dialect
from llmrun.structured.textstream import TextStream
from llmrun.structured.tools import Tool

UNFINISHED = {"finish_reason": None}


class ChunkStream:
    """The chunks of one call's stream, in order; ``head`` (id, created, model, …) goes into each."""

    def __init__(self, call: Call, head: dict[str, Any], *, chat: bool, dialect: Dialect | None = None) -> None:
        self.call = call
        self.head = head
        self.chat = chat
        self.kind = "chat.completion.chunk" if chat else "text_completion"
        self.remaining = len(call.requests)
        self.dialect = dialect
        self.texts = [TextStream(dialect) for _ in call.requests] if dialect is not None else None
        self.calls = [CallStream(dialect, _tools(r)) for r in call.requests] if dialect is not None else []
        self.results: dict[int, Result] = {}

    def start(self) -> list[dict[str, Any]]:
        """What a chat stream opens with: each choice's role."""
        if not self.chat:
            return []
        return [self._chunk([self._choice(i, None, None, role=True) for i in range(self.remaining)])]

    def token(self, index: int, event: Token) -> list[dict[str, Any]]:
        chunks = []
        if event.reasoning and self.chat:
            thought = {"reasoning_content": event.reasoning}
            chunks.append(self._chunk([{"index": index, "delta": thought, "logprobs": None, **UNFINISHED}]))
        if self.texts is not None:  # with tools: text once the answer shows it is not a call, else calls
            text = self.texts[index]
            shown = text.feed(event.text)
            if shown:
                chunks.append(self._chunk([self._choice(index, shown, None)]))
            if text.state == "calls":
                chunks += self._calls(index)
        elif event.text:
            logprobs = token_logprobs(event, self.call.logprobs, self.chat)
            chunks.append(self._chunk([self._choice(index, event.text, None, logprobs)]))
        return chunks

    def result(self, index: int, event: Result) -> list[dict[str, Any]]:
        """A choice's end: with tools, its calls and any text not yet shown; then its finish_reason."""
        self.remaining -= 1
        self.results[index] = event
        chunks = []
        if self.texts is not None:  # the calls' last fragments (or whole, where none streamed); any text not shown
            if self.texts[index].state == "calls":
                chunks += self._calls(index)
            streamed = self.calls[index].calls
            for delta in tool_call_deltas(event.tool_calls[streamed:], first=streamed):
                chunks.append(self._tool_chunk(index, delta))
            shown, content = self.texts[index].shown, event.content or ""
            if not event.tool_calls and content.startswith(shown) and content != shown:
                chunks.append(self._chunk([self._choice(index, content[len(shown) :], None)]))
        elif event.tool_calls:  # a remote engine's calls, read there: whole
            chunks += [self._tool_chunk(index, delta) for delta in tool_call_deltas(event.tool_calls)]
        chunks.append(self._chunk([self._choice(index, None if self.chat else "", finish_reason(event))]))
        return chunks

    def end(self) -> list[dict[str, Any]]:
        """After the last choice: the usage chunk, when the client asked for it."""
        if not self.call.include_usage:
            return []
        return [self._chunk([], usage=usage([self.results[i] for i in sorted(self.results)], self.call.n))]

    def _calls(self, index: int) -> list[dict[str, Any]]:
        """What the answer's calls added since the last chunk: a call's id and name, or arguments text."""
        assert self.texts is not None and self.dialect is not None
        chunks = []
        for event in self.calls[index].advance(self.texts[index].buffer):
            if isinstance(event, CallStart):
                function = {"name": event.name, "arguments": ""}
                delta = {"index": event.index, "id": self.dialect.new_id(), "type": "function", "function": function}
            else:
                delta = {"index": event.index, "function": {"arguments": event.text}}
            chunks.append(self._tool_chunk(index, [delta]))
        return chunks

    def _tool_chunk(self, index: int, delta: list[dict[str, Any]]) -> dict[str, Any]:
        return self._chunk([{"index": index, "delta": {"tool_calls": delta}, "logprobs": None, **UNFINISHED}])

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {**self.head, "object": self.kind, "choices": choices, **extra}

    def _choice(
        self, index: int, text: str | None, finish: str | None, logprobs: Any = None, role: bool = False
    ) -> dict[str, Any]:
        if not self.chat:
            return {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
        delta: dict[str, Any] = {}
        if role:
            delta = {"role": "assistant", "content": ""}
        elif text is not None:
            delta = {"content": text}
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}


def token_logprobs(token: Token, alternatives: int | None, chat: bool) -> Any:
    """A streamed token's log-probability and its alternatives, in the chat or the completions shape."""
    if alternatives is None or token.logprob is None:
        return None
    if chat:

        def one(piece: bytes, logprob: float) -> dict[str, Any]:
            return {"token": piece.decode("utf-8", "replace"), "logprob": logprob, "bytes": list(piece)}

        entry = {
            **one(token.text.encode(), token.logprob),
            "top_logprobs": [one(c.piece, c.logprob) for c in token.top[:alternatives]],
        }
        return {"content": [entry], "refusal": None}
    return {
        "tokens": [token.text],
        "token_logprobs": [token.logprob],
        "top_logprobs": [{c.piece.decode("utf-8", "replace"): c.logprob for c in token.top[:alternatives]}],
        "text_offset": [0],
    }


def _tools(request: Request) -> tuple[Tool, ...]:
    return request.tools.tools if request.tools is not None else ()
