"""The backend contract: what every inference backend provides, and the events it streams.

A backend loads a model file into a :class:`LoadedModel`. ``stream`` runs the
textbook loop — forward pass with a KV cache, next-token distribution, sampling,
append, repeat — and yields one :class:`Token` per generated token followed by
one :class:`Done` carrying the statistics. Stats travel with the stream.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from llmrun.decoding.events import BatchOutcome, BatchRequest, Done, Token
from llmrun.decoding.sampling import SamplingParams
from llmrun.decoding.speculative import Draft
from llmrun.decoding.tokens import Vocabulary
from llmrun.errors import InvalidParameter, LlmrunError, backend_cannot

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from llmrun.models.kv_store import KvStore
    from llmrun.structured.grammar import Constraint

KvType = Literal["f16", "q8_0", "q4_0"]
KeepPoint = Literal["prompt", "answer"]  # where a generation's cells are kept in the KV store
KV_TYPES: tuple[str, ...] = ("f16", "q8_0", "q4_0")


@dataclass(frozen=True, slots=True)
class LoadParams:
    """How a model is loaded (the load-time counterpart of :class:`SamplingParams`)."""

    n_ctx: int
    n_threads: int
    n_gpu_layers: int  # -1: all layers
    kv_type: str = "f16"  # element type of the KV cache: f16, q8_0 or q4_0
    vocab_only: bool = False  # load the tokenizer only (tokenize, fast)
    max_kv_size: int | None = None  # MLX: a rotating KV cache of this many tokens (None: grows to n_ctx)
    rpc: tuple[str, ...] = ()  # llama.cpp RPC workers (HOST:PORT) that hold the offloaded layers
    flash_attn: bool | None = None  # GGUF: llama.cpp's flash attention (None: by the model, see backends.attention)
    show_special: bool = False  # answers keep control and markup tokens as text (llama.cpp's --special)

    def __post_init__(self) -> None:
        if self.kv_type not in KV_TYPES:
            raise InvalidParameter("kv_type", self.kv_type, f"one of {', '.join(KV_TYPES)}")
        if isinstance(self.n_ctx, bool) or not isinstance(self.n_ctx, int) or self.n_ctx < 16:
            raise InvalidParameter("n_ctx", self.n_ctx, "an integer >= 16")
        if isinstance(self.n_threads, bool) or not isinstance(self.n_threads, int) or self.n_threads < 1:
            raise InvalidParameter("n_threads", self.n_threads, "an integer >= 1")
        if isinstance(self.n_gpu_layers, bool) or not isinstance(self.n_gpu_layers, int):
            raise InvalidParameter("n_gpu_layers", self.n_gpu_layers, "an integer (-1 = all)")
        if self.n_gpu_layers < -1:
            raise InvalidParameter("n_gpu_layers", self.n_gpu_layers, ">= -1 (-1 = all layers)")
        if self.max_kv_size is not None and (
            isinstance(self.max_kv_size, bool) or not isinstance(self.max_kv_size, int) or self.max_kv_size < 16
        ):
            raise InvalidParameter("max_kv_size", self.max_kv_size, "an integer >= 16")
        if not isinstance(self.rpc, tuple) or not all(isinstance(worker, str) for worker in self.rpc):
            raise InvalidParameter("rpc", self.rpc, "a list of HOST:PORT workers")


class LoadedModel(Vocabulary, Protocol):
    """What every backend does: tokens in and out, and a stream of generated tokens.

    Everything else is an optional capability with a protocol of its own (:class:`Logits`,
    :class:`Evaluates`, :class:`GeneratesBatch`), so a backend that can only complete text
    (a remote engine) implements only this; :func:`with_logits`, :func:`evaluating` and :func:`batching` ask for one."""

    path: Path
    n_ctx: int

    def stream(
        self, ids: Sequence[int], params: SamplingParams, *, logprobs: int = 0, constraint: Constraint | None = None
    ) -> Iterator[Token | Done]: ...

    def close(self) -> None: ...


@runtime_checkable
class Logits(Protocol):
    """Raw next-token logits (``llmrun next``, the quality report, the backends' agreement tests)."""

    def logits(self, ids: Sequence[int]) -> npt.NDArray[np.float32]: ...

    # teacher forcing: the raw logits after ids[:1], ids[:2], …, as (positions × vocabulary) chunks
    def position_logits(self, ids: Sequence[int]) -> Iterator[npt.NDArray[np.float32]]: ...


@runtime_checkable
class Evaluates(Protocol):
    """The forward pass by itself, for benchmarks: clear the KV cache, append tokens to it."""

    def reset(self) -> None: ...

    def eval(self, ids: Sequence[int]) -> None: ...


class Decoder(Protocol):
    """Sequences decoded together, admitted as slots free up (the server's continuous batching)."""

    @property
    def free(self) -> int: ...

    @property
    def active(self) -> bool: ...

    def admit(self, request: BatchRequest, logprobs: int = 0) -> LlmrunError | None: ...

    def step(self) -> list[tuple[int, Token | Done]]: ...

    def cancel(self, index: int) -> Done | None: ...

    def close(self) -> None: ...


@runtime_checkable
class GeneratesBatch(Protocol):
    """Many sequences at once: a whole list (``llmrun batch``), or a :class:`Decoder` that admits them as
    slots free up (the server's scheduler)."""

    def generate_batch(
        self, requests: Iterable[BatchRequest], parallel: int, n_ctx_seq: int
    ) -> Generator[BatchOutcome, None, None]: ...

    def batch_decoder(self, parallel: int, n_ctx_seq: int, *, reuse_prefix: bool = False) -> Decoder | None:
        """None when this model, as loaded, cannot batch (:attr:`batch_unsupported` says why)."""
        ...

    @property
    def batch_unsupported(self) -> str | None: ...


@runtime_checkable
class Speculates(Protocol):
    """Speculative decoding: a draft proposes tokens and the model keeps those it would have chosen."""

    @property
    def draft(self) -> Draft: ...

    @property
    def drafts_alone(self) -> bool:
        """Whether a draft model follows one sequence, so this model serves one request at a time."""
        ...

    def use_draft(self, draft: Draft, draft_model: LoadedModel | None = None) -> None:
        """Decode as ``draft`` says from now on (``draft_model``: the model that drafts, loaded)."""
        ...


@runtime_checkable
class SeesImages(Protocol):
    """Images in the prompt, through a projector (a GGUF model's mmproj, through libmtmd)."""

    def use_projector(self, path: Path, image_max_tokens: int | None = None) -> None: ...

    @property
    def sees_images(self) -> bool:
        """Whether a projector is loaded."""
        ...

    def image_positions(self, image: bytes) -> int:
        """The context positions an image takes (its tokens and the text the projector wraps it in)."""
        ...

    def stream_images(
        self,
        ids: Sequence[int],
        at: Sequence[int],
        images: Sequence[bytes],
        params: SamplingParams,
        *,
        logprobs: int = 0,
        constraint: Constraint | None = None,
    ) -> Iterator[Token | Done]:
        """A generation whose prompt has ``images[i]`` before token ``at[i]`` of ``ids``."""
        ...


@runtime_checkable
class KeepsKv(Protocol):
    """KV cells kept on disk (the KV store): a prompt that starts with a kept prefix skips its prefill,
    and what a generation evaluated is kept for the next process."""

    def kv_settings(self) -> dict[str, Any]:
        """What, besides the model file, decides the cells' bytes (the store's key)."""
        ...

    def use_kv_store(self, store: KvStore | None) -> None: ...

    def keep_at(self, point: KeepPoint) -> None:
        """What the next generations keep: their prompt (it may come again, or another question after the same
        document), or their prompt and answer (a conversation goes on from there)."""
        ...


def with_logits(model: object, what: str) -> Logits:
    """``model`` as :class:`Logits`, or one line saying what its backend cannot do."""
    if not isinstance(model, Logits):
        raise backend_cannot(what)
    return model


def evaluating(model: object, what: str) -> Evaluates:
    if not isinstance(model, Evaluates):
        raise backend_cannot(what)
    return model


def batching(model: object, what: str) -> GeneratesBatch:
    if not isinstance(model, GeneratesBatch):
        raise backend_cannot(what)
    return model


def speculating(model: object, what: str) -> Speculates:
    if not isinstance(model, Speculates):
        raise backend_cannot(what)
    return model


class Backend(Protocol):
    name: str

    def load(self, path: Path, params: LoadParams) -> LoadedModel: ...


def outside_vocabulary(ids: Sequence[int], vocab_size: int) -> int | None:
    """Where the first id outside a vocabulary of ``vocab_size`` is in ``ids`` (None: all inside)."""
    return next((i for i, token in enumerate(ids) if not 0 <= token < vocab_size), None)


@runtime_checkable
class ReadsTokens(Protocol):
    """An embedding model that also takes token ids (OpenAI's ``input`` as token arrays): it spells them back."""

    vocab_size: int  # ids run from 0 to vocab_size - 1

    def detokenize(self, ids: Sequence[int]) -> str: ...


class Embedder(Protocol):
    """A loaded embedding model: text in, one unit-length vector per text out."""

    path: Path
    dimension: int
    max_tokens: int  # the longest text it embeds whole (positions, less its special tokens)

    def count(self, text: str) -> int: ...

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]: ...

    def close(self) -> None: ...
