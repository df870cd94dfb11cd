"""The Responses API's streamed answer as server-sent events (pure): the engine's events in, ``(type, data)``
out, each with its ``sequence_number``.

The sequence OpenAI documents: ``response.created`` and ``response.in_progress`` (the Response with no
output yet); then output items in order — a ``reasoning`` item (``response.reasoning_summary_part.added``,
``response.reasoning_summary_text.delta``…), a ``message`` (``response.content_part.added``,
``response.output_text.delta``…``.done``), ``function_call`` items (``response.function_call_arguments.delta``
as the arguments are generated, ``.done``) — each opened by ``response.output_item.added`` and closed by
``response.output_item.done``; then ``response.completed`` (or ``response.incomplete``) with the whole
Response, whose output items are the ones streamed, under the same ids. With tools, text is held until it is
clear it is not a call (as on the chat route).
"""

from __future__ import annotations

from typing import Any

from llmrun.api.responses import (
    OutputIds,
    ResponsesCall,
    function_call,
    message_item,
    output_items,
    reasoning_item,
    response_body,
)
from llmrun.decoding.events import Token
from llmrun.engine.result import Result
from llmrun.structured.callstream import CallStart, CallStream
from llmrun.structured.dialects import Dialect
from llmrun.structured.textstream import TextStream

Event = tuple[str, dict[str, Any]]


class EventStream:
    """The events of one response, in order."""

    def __init__(
        self, call: ResponsesCall, ident: str, model: str, created: float, dialect: Dialect | None = None
    ) -> None:
        self.call = call
        self.ident = ident
        self.model = model
        self.created = created
        self.ids = OutputIds()
        self.sequence = 0
        self.text = TextStream(dialect) if dialect is not None else None
        tools = call.request.tools.tools if call.request.tools is not None else ()
        self.calls = CallStream(dialect, tools) if dialect is not None else None
        self.index = -1  # the output index of the last item opened
        self.open: dict[str, Any] | None = None  # the item being written: its kind and what it holds so far
        self.done: list[dict[str, Any]] = []  # the items closed, in order

    def _event(self, kind: str, **data: Any) -> Event:
        event = (kind, {"type": kind, "sequence_number": self.sequence, **data})
        self.sequence += 1
        return event

    def start(self) -> list[Event]:
        body = response_body(self.ident, self.model, self.call, self.created)
        return [self._event("response.created", response=body), self._event("response.in_progress", response=body)]

    def token(self, event: Token) -> list[Event]:
        out: list[Event] = []
        if event.reasoning:
            out += self._reasoning(event.reasoning)
        shown = self.text.feed(event.text) if self.text is not None else event.text
        if shown:
            out += self._text(shown)
        if self.text is not None and self.text.state == "calls":
            out += self._calls()
        return out

    def result(self, result: Result) -> list[Event]:
        """The answer's end: what was not streamed yet, every item closed, and the whole Response."""
        out: list[Event] = []
        streamed = 0
        if self.text is not None and self.calls is not None:
            if self.text.state == "calls":
                out += self._calls()
            streamed = self.calls.calls
        final = output_items(result, self.ids, self.call.names)
        if result.reasoning and not self._seen("reasoning"):
            out += self._reasoning(result.reasoning)
        text = next((i["content"][0]["text"] for i in final if i["type"] == "message"), None)
        if text is not None:
            shown = self.open["text"] if self.open and self.open["kind"] == "message" else None
            if shown is None and not self._seen("message"):
                out += self._text(text) if text else self._open_message()
            elif shown is not None and text.startswith(shown) and text != shown:
                out += self._text(text[len(shown) :])
        for index, tool in enumerate(result.tool_calls[streamed:], start=streamed):
            out += self._open_call(index, tool.name)
            out += self._arguments(tool.arguments)
        out += self._close(final)
        body = response_body(self.ident, self.model, self.call, self.created, result, self.done)
        kind = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
        return [*out, self._event(kind, response=body)]

    def failed(self, error: dict[str, Any]) -> list[Event]:
        """The answer stopped by an error: an ``error`` event, then ``response.failed``."""
        body = response_body(self.ident, self.model, self.call, self.created, output=self.done, status="failed")
        body["error"] = {"code": error.get("code") or "server_error", "message": error["message"]}
        return [self._event("error", **error), self._event("response.failed", response=body)]

    # --- items ---------------------------------------------------------------------------------------

    def _seen(self, kind: str) -> bool:
        return any(i["type"] == kind for i in self.done) or (self.open is not None and self.open["kind"] == kind)

    def _add(self, kind: str, item: dict[str, Any], **held: Any) -> list[Event]:
        out = self._close()
        self.index += 1
        self.open = {"kind": kind, "item": item, **held}
        return [*out, self._event("response.output_item.added", output_index=self.index, item=item)]

    def _reasoning(self, text: str) -> list[Event]:
        out: list[Event] = []
        if self.open is None or self.open["kind"] != "reasoning":
            item = {"type": "reasoning", "id": self.ids.reasoning, "summary": []}
            out += self._add("reasoning", item, text="")
            part = {"type": "summary_text", "text": ""}
            out.append(self._summary_event("response.reasoning_summary_part.added", part=part))
        assert self.open is not None
        self.open["text"] += text
        return [*out, self._summary_event("response.reasoning_summary_text.delta", delta=text)]

    def _summary_event(self, kind: str, **data: Any) -> Event:
        return self._event(kind, item_id=self.ids.reasoning, output_index=self.index, summary_index=0, **data)

    def _open_message(self) -> list[Event]:
        item = {"type": "message", "id": self.ids.message, "status": "in_progress", "role": "assistant", "content": []}
        out = self._add("message", item, text="")
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [*out, self._part_event("response.content_part.added", part=part)]

    def _part_event(self, kind: str, **data: Any) -> Event:
        return self._event(kind, item_id=self.ids.message, output_index=self.index, content_index=0, **data)

    def _text(self, text: str) -> list[Event]:
        out = self._open_message() if self.open is None or self.open["kind"] != "message" else []
        assert self.open is not None
        self.open["text"] += text
        return [*out, self._part_event("response.output_text.delta", delta=text, logprobs=[])]

    def _calls(self) -> list[Event]:
        assert self.text is not None and self.calls is not None
        out: list[Event] = []
        for event in self.calls.advance(self.text.buffer):
            if isinstance(event, CallStart):
                out += self._open_call(event.index, event.name)
            elif event.text:
                out += self._arguments(event.text)
        return out

    def _open_call(self, index: int, name: str) -> list[Event]:
        from llmrun.prompt.template import ToolCall

        ids = self.ids.call(index)
        item = function_call(ToolCall(ids[1], name, ""), ids, self.call.names, "in_progress")
        return self._add("call", item, text="", index=index)

    def _arguments(self, text: str) -> list[Event]:
        assert self.open is not None and self.open["kind"] == "call"
        self.open["text"] += text
        item_id = self.open["item"]["id"]
        return [
            self._event("response.function_call_arguments.delta", item_id=item_id, output_index=self.index, delta=text)
        ]

    def _close(self, final: list[dict[str, Any]] | None = None) -> list[Event]:
        """The open item closed: with its final form when the answer is whole (``final``), else with what
        was streamed of it."""
        if self.open is None:
            return []
        kind, item, text = self.open["kind"], self.open["item"], self.open["text"]
        done = next((i for i in final or [] if i["id"] == item["id"]), None)
        out: list[Event] = []
        if kind == "reasoning":
            done = done or reasoning_item(item["id"], text)
            part = done["summary"][0]
            out.append(self._summary_event("response.reasoning_summary_text.done", text=part["text"]))
            out.append(self._summary_event("response.reasoning_summary_part.done", part=part))
        elif kind == "message":
            done = done or message_item(item["id"], text, "completed")
            part = done["content"][0]
            out.append(self._part_event("response.output_text.done", text=part["text"], logprobs=[]))
            out.append(self._part_event("response.content_part.done", part=part))
        else:
            done = done or {**item, "arguments": text, "status": "completed"}
            data = {"item_id": item["id"], "output_index": self.index, "arguments": done["arguments"]}
            out.append(self._event("response.function_call_arguments.done", **data))
        out.append(self._event("response.output_item.done", output_index=self.index, item=done))
        self.done.append(done)
        self.open = None
        return out
