"""Anthropic's streamed answer as server-sent events (pure): the engine's events in, ``(event, data)`` out.

The sequence Anthropic documents: ``message_start`` and a ``ping``; then content blocks, each opened by
``content_block_start``, grown by ``content_block_delta`` (``thinking_delta`` for a reasoning model's
thinking, ``text_delta``, ``input_json_delta`` for a call's arguments as they are generated) and closed by
``content_block_stop``; then ``message_delta`` with the ``stop_reason`` and the usage, and ``message_stop``.
With tools, text is held until it is clear it is not a call (as on the OpenAI route).
"""

from __future__ import annotations

from typing import Any

from llmrun.api.anthropic import MessagesCall, stop_reason, tool_id, usage
from llmrun.decoding.events import Token
from llmrun.engine.result import Result
from llmrun.structured.callstream import CallStart, CallStream
from llmrun.structured.dialects import Dialect
from llmrun.structured.textstream import TextStream

Event = tuple[str, dict[str, Any]]


class EventStream:
    """The events of one Messages answer, in order."""

    def __init__(
        self, call: MessagesCall, ident: str, model: str, dialect: Dialect | None = None, input_tokens: int = 0
    ) -> None:
        self.call = call
        self.ident = ident
        self.model = model
        self.input_tokens = input_tokens
        self.dialect = dialect
        self.text = TextStream(dialect) if dialect is not None else None
        tools = call.request.tools.tools if call.request.tools is not None else ()
        self.calls = CallStream(dialect, tools) if dialect is not None else None
        self.index = -1
        self.open: str | None = None  # the kind of the block being written

    def start(self) -> list[Event]:
        message: dict[str, Any] = {
            "id": self.ident,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": 0},
        }
        return [("message_start", {"type": "message_start", "message": message}), ("ping", {"type": "ping"})]

    def token(self, event: Token) -> list[Event]:
        out: list[Event] = []
        if event.reasoning:
            out += self._block("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            out.append(self._delta({"type": "thinking_delta", "thinking": event.reasoning}))
        shown = self.text.feed(event.text) if self.text is not None else event.text
        if shown:
            out += self._text(shown)
        if self.text is not None and self.text.state == "calls":
            out += self._calls()
        return out

    def result(self, result: Result) -> list[Event]:
        """The answer's end: calls not streamed yet (whole), text not shown, the stop reason and the usage."""
        out: list[Event] = []
        streamed = 0
        if self.text is not None and self.calls is not None:
            if self.text.state == "calls":
                out += self._calls()
            streamed = self.calls.calls
            shown, content = self.text.shown, result.content or ""
            if not result.tool_calls and content.startswith(shown) and content != shown:
                out += self._text(content[len(shown) :])
        for call in result.tool_calls[streamed:]:
            block = {"type": "tool_use", "id": tool_id(call.id), "name": call.name, "input": {}}
            out += self._block("tool_use", block, new=True)
            out.append(self._delta({"type": "input_json_delta", "partial_json": call.arguments}))
        out += self._close()
        reason, sequence = stop_reason(result, self.call.stop_sequences)
        delta = {"stop_reason": reason, "stop_sequence": sequence}
        out.append(("message_delta", {"type": "message_delta", "delta": delta, "usage": usage(result)}))
        out.append(("message_stop", {"type": "message_stop"}))
        return out

    def _text(self, text: str) -> list[Event]:
        return [*self._block("text", {"type": "text", "text": ""}), self._delta({"type": "text_delta", "text": text})]

    def _calls(self) -> list[Event]:
        assert self.text is not None and self.calls is not None and self.dialect is not None
        out: list[Event] = []
        for event in self.calls.advance(self.text.buffer):
            if isinstance(event, CallStart):
                block = {"type": "tool_use", "id": tool_id(self.dialect.new_id()), "name": event.name, "input": {}}
                out += self._block("tool_use", block, new=True)
            elif event.text:
                out.append(self._delta({"type": "input_json_delta", "partial_json": event.text}))
        return out

    def _block(self, kind: str, block: dict[str, Any], *, new: bool = False) -> list[Event]:
        """The block of ``kind`` open (closing another one first); ``new``: a fresh one even if one is open."""
        if self.open == kind and not new:
            return []
        out = self._close()
        self.index += 1
        self.open = kind
        out.append(
            ("content_block_start", {"type": "content_block_start", "index": self.index, "content_block": block})
        )
        return out

    def _close(self) -> list[Event]:
        if self.open is None:
            return []
        self.open = None
        return [("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def _delta(self, delta: dict[str, Any]) -> Event:
        return ("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})
