"""The one result shape: what ``run --json``, batch lines and server responses are built from."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmrun.decoding.events import Candidate, Done, FinishReason, GenerationStats, Token

if TYPE_CHECKING:
    from llmrun.prompt.template import ToolCall
    from llmrun.structured.formats import Format


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    id: int
    piece: bytes
    logprob: float
    top: tuple[Candidate, ...]

    @classmethod
    def of(cls, token: Token, piece: bytes) -> TokenLogprob:
        return cls(token.id, piece, token.logprob if token.logprob is not None else 0.0, token.top)

    def to_dict(self) -> dict[str, Any]:
        def shown(data: bytes) -> dict[str, Any]:
            return {"token": data.decode("utf-8", "replace"), "bytes": list(data)}

        return {
            "id": self.id,
            **shown(self.piece),
            "logprob": self.logprob,
            "top": [{"id": c.id, **shown(c.piece), "logprob": c.logprob} for c in self.top],
        }


@dataclass(frozen=True, slots=True)
class Result:
    text: str
    prompt_tokens: int
    generated_tokens: int
    finish_reason: FinishReason  # eos, stop, length, context
    stop_string: str | None
    seed: int | None  # the seed used (None: greedy)
    time_to_first_token_s: float
    prompt_tokens_per_s: float
    generation_tokens_per_s: float
    prompt_format: str = "plain"
    logprobs: tuple[TokenLogprob, ...] | None = None  # None: not asked for
    cached_tokens: int = 0  # of the prompt tokens, those an earlier request's KV cells already held
    structured: str | None = None  # the kind of format the answer was constrained to (json, schema, lark, gbnf)
    valid: bool | None = None  # constrained: whether the text is whole under its format (None: unconstrained)
    content: str | None = None  # with tools: the text besides the calls (None: only calls)
    tool_calls: tuple[ToolCall, ...] = ()
    reasoning: str | None = None  # a reasoning model's reasoning, apart from ``text`` (None: it did not reason)
    drafted: int = 0  # speculative decoding: tokens the draft proposed
    accepted: int = 0  # … and those the model kept
    image_tokens: int = 0  # of the prompt tokens, the positions images took
    image_seconds: float = 0.0  # encoding them (part of the time to the first token)
    images_reused: int = 0  # images whose encoding an earlier request left

    @classmethod
    def of(
        cls,
        done: Done,
        prompt_format: str,
        logprobs: tuple[TokenLogprob, ...] | None = None,
        response_format: Format | None = None,
    ) -> Result:
        s = done.stats
        return cls(
            text=done.text,
            prompt_tokens=s.prompt_tokens,
            generated_tokens=s.generated_tokens,
            finish_reason=s.finish_reason,
            stop_string=s.stop_string,
            seed=s.seed,
            time_to_first_token_s=s.prompt_seconds,
            prompt_tokens_per_s=s.prompt_tps,
            generation_tokens_per_s=s.generation_tps,
            prompt_format=prompt_format,
            logprobs=logprobs,
            cached_tokens=s.cached_tokens,
            structured=response_format.kind if response_format is not None else None,
            valid=bool(s.valid) if response_format is not None else None,
            drafted=s.drafted,
            accepted=s.accepted,
            image_tokens=s.image_tokens,
            image_seconds=s.image_seconds,
            images_reused=s.images_reused,
        )

    def stats(self) -> GenerationStats:
        """The answer's statistics as a backend reports them (the decode time from the decode speed)."""
        decoded = self.generated_tokens - 1
        tps = self.generation_tokens_per_s
        return GenerationStats(
            prompt_tokens=self.prompt_tokens,
            generated_tokens=self.generated_tokens,
            prompt_seconds=self.time_to_first_token_s,
            generation_seconds=decoded / tps if decoded > 0 and tps > 0 else 0.0,
            finish_reason=self.finish_reason,
            seed=self.seed,
            stop_string=self.stop_string,
            cached_tokens=self.cached_tokens,
            valid=self.valid,
            drafted=self.drafted,
            accepted=self.accepted,
            image_tokens=self.image_tokens,
            image_seconds=self.image_seconds,
            images_reused=self.images_reused,
        )

    @property
    def parsed(self) -> Any:
        """A valid JSON answer as a value (None when the answer is not constrained JSON, or not whole)."""
        if not self.valid or self.structured not in ("json", "schema"):
            return None
        return json.loads(self.text)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "text": self.text,
            "prompt_format": self.prompt_format,
            "tokens": {
                "prompt": self.prompt_tokens,
                "cached": self.cached_tokens,
                "generated": self.generated_tokens,
                "drafted": self.drafted,
                "accepted": self.accepted,
            },
            "timings": {
                "time_to_first_token_s": round(self.time_to_first_token_s, 4),
                "prompt_tokens_per_s": round(self.prompt_tokens_per_s, 2),
                "generation_tokens_per_s": round(self.generation_tokens_per_s, 2),
            },
            "stop_reason": self.finish_reason,
            "stop_string": self.stop_string,
            "seed": self.seed,
        }
        if self.image_tokens:
            data["tokens"]["images"] = self.image_tokens
            data["tokens"]["images_reused"] = self.images_reused
            data["timings"]["image_encode_s"] = round(self.image_seconds, 4)
        if self.reasoning is not None:
            data = {"text": self.text, "reasoning_content": self.reasoning, **data}
        if self.structured is not None:
            data["format"] = self.structured
            data["valid"] = self.valid
            if self.valid and self.structured in ("json", "schema"):
                data["parsed"] = self.parsed
        if self.logprobs is not None:
            data["logprobs"] = [entry.to_dict() for entry in self.logprobs]
        return data
