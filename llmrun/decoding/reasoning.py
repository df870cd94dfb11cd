"""Reasoning models: the text between the model's reasoning markers, apart from the answer (pure).

A template that names reasoning markers (``<think>…</think>`` and the model-specific forms)
makes a model that may reason before it answers. Its reasoning opens either in the answer
(the model writes the open marker first) or in the prompt (DeepSeek R1's generation prompt
ends with ``<think>``). :class:`Splitter` separates a streamed answer into reasoning and
answer text as it comes, holding back only what could still be a marker; :func:`split` does
the same for a whole text, so streams and results agree.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from llmrun.decoding.events import Token


@dataclass(frozen=True, slots=True)
class Markers:
    open: str
    close: str


KNOWN_MARKERS = (
    Markers("<think>", "</think>"),  # Qwen3, QwQ, DeepSeek R1/V3.1, GLM, MiniMax, Nemotron, SmolLM3, Hunyuan
    Markers("<seed:think>", "</seed:think>"),  # ByteDance Seed-OSS
    Markers("[THINK]", "[/THINK]"),  # Magistral, Ministral reasoning
    Markers("<|START_THINKING|>", "<|END_THINKING|>"),  # Cohere Command A reasoning
    Markers("\u25c1think\u25b7", "\u25c1/think\u25b7"),  # Kimi
)


@dataclass(frozen=True, slots=True)
class Thinking:
    """How a request's answer is split: the markers, and whether the prompt already opened them."""

    markers: Markers
    started: bool = False


def markers_for(template: str) -> Markers | None:
    """The reasoning markers a chat template writes or reads (None: not a reasoning model's template)."""
    for markers in KNOWN_MARKERS:
        if markers.close in template:
            return markers
    return None


def thinking_for(template: str, prompt: str) -> Thinking | None:
    """The split for an answer to ``prompt`` (rendered through ``template``)."""
    markers = markers_for(template)
    if markers is None:
        return None
    tail = prompt.rstrip()
    return Thinking(markers, tail.endswith(markers.open) and tail.rfind(markers.open) > tail.rfind(markers.close))


class Splitter:
    """An answer's text, fed as it streams, told apart into reasoning and answer.

    Reasoning is recognised where the answer starts with the open marker (after whitespace), or
    from the start when the prompt opened it; it ends at the close marker. Whitespace around the
    reasoning and before the answer is dropped, as llama-server and Ollama do. Without ``thinking``
    (a template with no reasoning markers) everything is answer, passed through as it comes."""

    def __init__(self, thinking: Thinking | None) -> None:
        self.passthrough = thinking is None
        self.markers = thinking.markers if thinking is not None else Markers("", "")
        self.state = "answer" if thinking is None else "thinking" if thinking.started else "start"
        self.reasoned = thinking is not None and thinking.started  # whether any reasoning was opened
        self._buffer = ""
        self._reasoning_shown = False

    def feed(self, text: str) -> tuple[str, str]:
        """More of the answer; the (reasoning, answer) text to show now."""
        self._buffer += text
        reasoning, answer = "", ""
        while True:
            if self.state == "start":
                head = self._buffer.lstrip()
                if head.startswith(self.markers.open):
                    self.state, self.reasoned, self._buffer = "thinking", True, head[len(self.markers.open) :]
                    continue
                if not head or self.markers.open.startswith(head):
                    return reasoning, answer  # could still open reasoning
                self.state = "answer"
            if self.state == "thinking":
                end = self._buffer.find(self.markers.close)
                if end >= 0:
                    reasoning += self._reasoning(self._buffer[:end].rstrip())
                    self.state, self._buffer = "after", self._buffer[end + len(self.markers.close) :]
                    continue
                keep = _partial(self._buffer, self.markers.close)
                shown = self._buffer[: len(self._buffer) - keep].rstrip()
                reasoning += self._reasoning(shown)
                self._buffer = self._buffer[len(shown) :]
                return reasoning, answer
            if self.state == "after":
                head = self._buffer.lstrip()
                if not head:
                    self._buffer = ""
                    return reasoning, answer
                self.state, self._buffer = "answer", head
            answer += self._buffer
            self._buffer = ""
            return reasoning, answer

    def finish(self) -> tuple[str, str]:
        """The end of the answer: what was held back."""
        held, self._buffer = self._buffer, ""
        if self.state == "thinking":
            return self._reasoning(held.rstrip()), ""
        if self.state == "start":
            self.state = "answer"
            return "", held
        return "", "" if self.state == "after" else held

    def _reasoning(self, text: str) -> str:
        if not self._reasoning_shown:
            text = text.lstrip()
            self._reasoning_shown = bool(text)
        return text

    def token(self, event: Token) -> Token:
        """``event`` with its text split into answer (``text``) and ``reasoning``."""
        if self.passthrough:
            return event
        reasoning, answer = self.feed(event.text)
        return dataclasses.replace(event, text=answer, reasoning=reasoning)

    def flush(self) -> Token | None:
        """A last text-only event with what was held back (None: nothing was)."""
        reasoning, answer = self.finish()
        return Token(-1, answer, reasoning=reasoning) if reasoning or answer else None


def _partial(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that could begin ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def split(thinking: Thinking | None, text: str) -> tuple[str | None, str]:
    """A whole answer as (reasoning, answer); reasoning is None when the model did not reason."""
    splitter = Splitter(thinking)
    reasoning, answer = splitter.feed(text)
    more_reasoning, more_answer = splitter.finish()
    return (reasoning + more_reasoning if splitter.reasoned else None), answer + more_answer
