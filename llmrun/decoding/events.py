"""The events a generation streams (one Token per generated token, then one Done with the statistics)
and the batch decoder's requests and outcomes: plain data every layer above reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from llmrun.decoding.sampling import SamplingParams
from llmrun.errors import LlmrunError

if TYPE_CHECKING:
    from llmrun.structured.grammar import Constraint


FinishReason = Literal["eos", "stop", "length", "context", "time"]  # time: the server's --request-timeout


@dataclass(frozen=True, slots=True)
class Candidate:
    """A token the model considered, with its log-probability under the model (temperature 1)."""

    id: int
    piece: bytes
    logprob: float


@dataclass(frozen=True, slots=True)
class Token:
    """One generated token and the text it completes (may be empty while held back).

    ``logprob`` and ``top`` are filled when the stream was asked for log-probabilities; a reasoning
    model's reasoning comes in ``reasoning``, apart from the answer's ``text`` (see llmrun.decoding.reasoning).
    """

    id: int
    text: str
    logprob: float | None = None
    top: tuple[Candidate, ...] = ()
    reasoning: str = ""


@dataclass(frozen=True, slots=True)
class GenerationStats:
    prompt_tokens: int
    generated_tokens: int
    prompt_seconds: float  # prefill: from the call to the first sampled token
    generation_seconds: float  # from the first token to the last
    finish_reason: FinishReason
    seed: int | None  # the seed actually used (None for greedy)
    stop_string: str | None = None
    cached_tokens: int = 0  # prompt tokens whose KV cells were kept from an earlier request, not evaluated
    valid: bool | None = None  # constrained output: whether the text is complete under its format
    drafted: int = 0  # speculative decoding: tokens proposed by the draft
    accepted: int = 0  # … and those the model kept
    image_tokens: int = 0  # of prompt_tokens, the positions images take
    image_seconds: float = 0.0  # encoding the images (part of prompt_seconds)
    images_reused: int = 0  # images whose encoding was kept from an earlier request

    @property
    def prompt_tps(self) -> float:
        evaluated = self.prompt_tokens - self.cached_tokens
        return evaluated / self.prompt_seconds if self.prompt_seconds > 0 else 0.0

    @property
    def generation_tps(self) -> float:
        # the first token's time is the prefill; decode speed is over the rest
        decoded = self.generated_tokens - 1
        return decoded / self.generation_seconds if decoded > 0 and self.generation_seconds > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Done:
    text: str  # the whole answer, as streamed
    stats: GenerationStats


@dataclass(frozen=True, slots=True)
class BatchRequest:
    index: int  # the caller's key, returned with the outcome
    ids: list[int]
    params: SamplingParams
    constraint: Constraint | None = None  # the format the answer must follow (structured output)
    images: tuple[bytes, ...] = ()  # images in the prompt (a model with a projector): ``images[i]`` before token
    image_at: tuple[int, ...] = ()  # ``image_at[i]`` of ``ids``


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    index: int
    done: Done | None  # None when the request failed
    error: LlmrunError | None = None
