"""The GGUF backend: llama.cpp through llama-cpp-python.

``llama_cpp`` is imported only when a model is loaded, so the CLI starts fast.
:func:`sampler_kwargs` is the one place :class:`SamplingParams` becomes
llama-cpp-python arguments.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import time
import warnings
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmrun.backends.base import KeepPoint, LoadParams
from llmrun.backends.llama_parts import _masker, sampler_kwargs
from llmrun.decoding.assembler import assemble, score
from llmrun.decoding.events import BatchOutcome, BatchRequest, Candidate, Done, Token
from llmrun.decoding.sampling import SamplingParams
from llmrun.decoding.speculative import Draft, Gate
from llmrun.decoding.tokens import TokenKind
from llmrun.errors import BackendError, ContextFull, LlmrunError, UsageError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from llmrun.backends.base import (
        Evaluates,
        GeneratesBatch,
        KeepsKv,
        LoadedModel,
        Logits,
        SeesImages,
        Speculates,
    )
    from llmrun.backends.gguf_spec import ModelDrafter
    from llmrun.backends.gguf_vision import Projector
    from llmrun.backends.trace import Geometry, Looks, TopK, Trace
    from llmrun.models.kv_store import KvStore
    from llmrun.structured.grammar import Constrains, Constraint


# ggml_log_level: NONE, DEBUG, INFO, WARN, ERROR, CONT (continues the previous line)
_LOG_LEVELS = {0: logging.DEBUG, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_log = logging.getLogger("llmrun.llama_cpp")
_log_callback: Any = None  # kept referenced: llama.cpp holds a raw pointer to it


def _route_llama_logs() -> None:
    """Send llama.cpp's log lines to the ``llmrun.llama_cpp`` logger instead of stderr."""
    global _log_callback
    if _log_callback is not None:
        return
    import llama_cpp

    @llama_cpp.llama_log_callback  # type: ignore[untyped-decorator]
    def callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        line = text.decode("utf-8", "replace").rstrip()
        if line:
            _log.log(_LOG_LEVELS.get(level, logging.DEBUG), "%s", line)

    _log_callback = callback
    llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))


def _flash_attention(path: Path, params: LoadParams) -> bool:
    """``params.flash_attn``, or llmrun's choice for this model (:mod:`llmrun.backends.attention`)."""
    if params.flash_attn is not None:
        return params.flash_attn
    if params.vocab_only:
        return False  # no context: nothing attends
    from llmrun.backends.attention import flash_attention
    from llmrun.formats.gguf_header import read_header
    from llmrun.formats.header_cache import cached_header
    from llmrun.formats.memory import geometry

    try:
        geom = geometry(cached_header(path, read_header))
    except LlmrunError:
        geom = None  # llama.cpp says what is wrong with the file as it loads it
    offloaded = bool(params.rpc) or (params.n_gpu_layers != 0 and gpu_offload_supported())
    return flash_attention(geom.head_dim_k if geom else None, params.kv_type, offloaded)


def gpu_offload_supported() -> bool:
    """Whether llama.cpp has a GPU here (RPC workers are not counted: they are asked for with `rpc`)."""
    from llmrun.backends.ggml_rpc import has_gpu

    return has_gpu()


class GgufModel:
    """A loaded GGUF model; implements :class:`llmrun.backends.base.LoadedModel`."""

    def __init__(self, llama: Any, path: Path, params: LoadParams) -> None:
        import llama_cpp

        self.llama = llama  # the batch engine builds its own context on these weights
        self.load_params = params
        self._lib = llama_cpp
        self._vocab = llama._model.vocab
        self._pieces: dict[tuple[int, bool], bytes] = {}
        self.path = path
        self.n_ctx = params.n_ctx
        self._grammar_tokenizer: Any = None
        self.draft = Draft()  # speculative decoding (see use_draft)
        self.draft_model_drafter: ModelDrafter | None = None
        self.kv_store: KvStore | None = None  # KV cells kept on disk (see use_kv_store)
        self.kv_point: KeepPoint = "prompt"
        self._n_swa = int(self._lib.llama_model_n_swa(llama._model.model))  # 0: no sliding window
        self.projector: Projector | None = None  # images (see use_projector)

    def use_draft(self, draft: Draft, draft_model: LoadedModel | None = None) -> None:
        """Decode speculatively from now on, as ``draft`` says (``draft_model``: the model that drafts, loaded;
        its vocabulary is checked against this model's, and a mismatch is one clear error)."""
        from llmrun.backends.gguf_spec import ModelDrafter
        from llmrun.decoding.speculative import check_vocabulary

        if draft_model is not None:
            if not isinstance(draft_model, GgufModel):
                raise UsageError("a GGUF model drafts for a GGUF model", "pass a GGUF draft model with `draft`")
            assert draft.model is not None
            sizes = (int(self.llama.n_vocab()), int(draft_model.llama.n_vocab()))
            check_vocabulary(self, draft_model, draft.model, sizes)
            if self.draft_model_drafter is not None:
                self.draft_model_drafter.close()
            self.draft_model_drafter = ModelDrafter(draft_model)
        if draft.mode == "model" and self.draft_model_drafter is None:
            raise UsageError(f"draft model {draft.model} is not loaded", "pass it with `draft`")
        self.draft = draft

    # --- the KV store (llmrun.backends.gguf_state) -----------------------------------
    def kv_settings(self) -> dict[str, Any]:
        from llmrun.backends.gguf_state import kv_settings

        params = self.llama.context_params
        return kv_settings(self.load_params, bool(params.flash_attn_type == 1), bool(params.swa_full))

    def use_kv_store(self, store: KvStore | None) -> None:
        """Keep what generations evaluate in ``store`` and start prompts from it (None: stop). A sliding-window
        cache saves only the window, so its kept prefixes are used whole (``KvStore.whole``)."""
        if store is not None:
            store.whole = self._n_swa > 0
        self.kv_store = store

    def keep_at(self, point: KeepPoint) -> None:
        self.kv_point = point

    def _start_from_store(self, ids: Sequence[int]) -> int:
        """Fill the cells from the KV store when it holds more of ``ids`` than they do; how many prompt tokens
        they spare (llama-cpp-python's ``generate`` finds the same prefix and cuts what follows it)."""
        from llmrun.backends.gguf_state import restore_into
        from llmrun.decoding.tokens import reusable

        llama = self.llama
        held = reusable(list(llama.input_ids[: llama.n_tokens]), ids) if llama.n_tokens else 0
        restored = restore_into(self.kv_store, llama._ctx.ctx, 0, ids, held) if self.kv_store else None
        if restored is not None:
            tokens, held = restored
            llama.input_ids[: len(tokens)] = tokens
            llama.n_tokens = len(tokens)
            llama._requires_eval = True
        return held

    def _keep(self, ids: Sequence[int]) -> None:
        """After the answer: keep in the store what it wants of the cells. A conversation's turn: all of them
        (its prompt and answer, replacing the turn before). A prompt: its boundaries — where it leaves a kept
        prefix (a new question after the same document), and all of it but its last token — cutting the
        live cells back to each (a full-size window still holds every cell; else that point is skipped)."""
        from llmrun.backends.gguf_batch import window_intact
        from llmrun.backends.gguf_state import keep

        llama, store = self.llama, self.kv_store
        if store is None or not llama.n_tokens:
            return
        if self.kv_point == "answer":
            keep(store, llama._ctx.ctx, 0, [int(t) for t in llama.input_ids[: llama.n_tokens]], replace_shorter=True)
            return
        for point in sorted({len(ids) - 1, store.branch(ids)}, reverse=True):
            if not 0 < point <= llama.n_tokens or not store.wanted(ids[:point]):
                continue
            llama._ctx.kv_cache_seq_rm(-1, point, -1)
            llama.n_tokens = point
            if window_intact(self._lib.llama_memory_seq_pos_min(llama._ctx.memory, 0), point, self._n_swa):
                keep(store, llama._ctx.ctx, 0, ids[:point])

    # --- tokens ---------------------------------------------------------------
    def tokenize(self, text: str, *, special: bool = False, add_bos: bool = False) -> list[int]:
        ids: list[int] = self.llama.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)
        return ids

    def piece(self, token_id: int, special: bool = False) -> bytes:
        """The bytes of one token; control tokens, and user-defined tokens that are markup
        (:mod:`llmrun.decoding.markers`), are empty unless ``special`` (or the model was loaded to show them)."""
        special = special or self.load_params.show_special
        cached = self._pieces.get((token_id, special))
        if cached is not None:
            return cached
        size = 64
        while True:
            buffer = ctypes.create_string_buffer(size)
            n = self._lib.llama_token_to_piece(self._vocab, token_id, buffer, size, 0, special)
            if n >= 0:
                break
            size = -n
        value = buffer.raw[:n]
        if not special and value and self.token_kind(token_id) == "user":
            from llmrun.decoding.markers import is_hidden_marker

            value = b"" if is_hidden_marker(value.decode("utf-8", "replace")) else value
        self._pieces[(token_id, special)] = value
        return value

    def token_bytes(self, token_id: int, *, special: bool = False) -> bytes:
        return self.piece(token_id, special)

    def detokenize(self, ids: Sequence[int], *, special: bool = False) -> str:
        return b"".join(self.piece(i, special) for i in ids).decode("utf-8", errors="replace")

    def token_kind(self, token_id: int) -> TokenKind:
        attr = int(self._lib.llama_vocab_get_attr(self._vocab, token_id))
        if attr & self._lib.LLAMA_TOKEN_ATTR_CONTROL:
            return "control"
        return "user" if attr & self._lib.LLAMA_TOKEN_ATTR_USER_DEFINED else "normal"

    def is_end(self, token_id: int) -> bool:
        return bool(self._lib.llama_vocab_is_eog(self._vocab, token_id))

    @property
    def bos_id(self) -> int | None:
        bos = int(self.llama.token_bos())
        return bos if bos >= 0 else None

    @property
    def eos_id(self) -> int | None:
        eos = int(self.llama.token_eos())
        return eos if eos >= 0 else None

    @property
    def adds_bos(self) -> bool:
        return bool(self.llama._model.add_bos_token())

    # --- generation -----------------------------------------------------------
    def stream(
        self, ids: Sequence[int], params: SamplingParams, *, logprobs: int = 0, constraint: Constraint | None = None
    ) -> Iterator[Token | Done]:
        if self.draft.on:
            from llmrun.backends.gguf_spec import drafter_for, speculative_stream

            gate = Gate() if self.draft.mode == "auto" else None
            yield from speculative_stream(
                self,
                ids,
                params,
                drafter_for(self, len(ids)),
                self.draft.tokens,
                gate=gate,
                logprobs=logprobs,
                constraint=constraint,
            )
            return
        started = time.perf_counter()
        cached = self._start_from_store(ids)
        yield from self._sample(list(ids), params, logprobs, constraint, cached, started)
        self._keep(ids)

    def _sample(
        self,
        keys: list[int],
        params: SamplingParams,
        logprobs: int,
        constraint: Constraint | None,
        cached: int,
        started: float,
    ) -> Iterator[Token | Done]:
        """The sampling loop over a prompt the context holds all but the tail of (``keys``: its tokens, or an
        image's positions' keys): llama-cpp-python evaluates what is left and samples; the answer assembled."""
        seed = params.run_seed()
        self.llama.set_seed(seed if seed is not None else 0)
        window = params.repeat_last_n
        self.llama.last_n_tokens_size = self.n_ctx if window == -1 else window
        # a constraint masks the logits first in the sampler chain (llama-cpp-python's custom sampler)
        processors = [_masker(constraint)] if constraint is not None else None
        sampled = self.llama.generate(keys, reset=True, logits_processor=processors, **sampler_kwargs(params))
        yield from assemble(
            sampled,
            self.piece,
            self.is_end,
            prompt_tokens=len(keys),
            n_ctx=self.n_ctx,
            params=params,
            seed=seed,
            score=self._scorer(logprobs) if logprobs > 0 else None,
            cached_tokens=cached,
            constraint=constraint,
            started=started,
        )

    def use_projector(self, path: Path, image_max_tokens: int | None = None) -> None:
        """Read images from now on, through the projector (mmproj) at ``path`` (see :mod:`gguf_vision`)."""
        from llmrun.backends.gguf_vision import Projector

        if self.projector is not None:
            self.projector.close()
        _route_llama_logs()
        self.projector = Projector(path, self.llama, self.load_params.n_threads, image_max_tokens, _log_callback)

    @property
    def sees_images(self) -> bool:
        return self.projector is not None

    def image_positions(self, image: bytes) -> int:
        if self.projector is None:
            raise UsageError("this model was loaded without a projector: it does not see images", "")
        return self.projector.positions(image)

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
        """:meth:`stream` for a prompt with images: ``images[i]`` sits before token ``at[i]`` of ``ids``."""
        from llmrun.backends.gguf_vision import evaluate, layout
        from llmrun.backends.images import counted, image_names, snapshot, too_long

        projector = self.projector
        if projector is None:
            raise UsageError("this model was loaded without a projector: it does not see images", "")
        started = time.perf_counter()
        spans = []
        try:
            for data, name in zip(images, image_names(len(images)), strict=True):
                spans.append(projector.span(data, name))
            plan = layout(ids, at, spans)
            image_positions = sum(s.positions for s in spans)
            if len(plan.keys) >= self.n_ctx:
                hint = "raise `n_ctx`, or give fewer or smaller images (`image_max_tokens`)"
                raise too_long(len(plan.keys), image_positions, len(spans), self.n_ctx, hint)
            before = snapshot(projector)
            cached = evaluate(projector, self.llama, plan)
            steps = self._sample(plan.keys, params, logprobs, constraint, cached, started)
            yield from counted(steps, projector, image_positions, before)
        finally:
            for span in spans:
                projector.free(span)

    def grammar_tokenizer(self) -> Any:
        """The vocabulary as llguidance reads it (control tokens marked special; every end-of-generation
        token ends a constrained answer); built on first use, about 2 s for Gemma's 262k tokens."""
        if self._grammar_tokenizer is None:
            from llguidance.llamacpp import lltokenizer_from_vocab

            n_vocab = int(self.llama.n_vocab())
            ends = [i for i in range(n_vocab) if self.is_end(i)]
            with warnings.catch_warnings():  # llguidance calls a llama.cpp function llama-cpp-python deprecates
                warnings.simplefilter("ignore", DeprecationWarning)
                tokenizer = lltokenizer_from_vocab(self._vocab, n_vocab=n_vocab, eos_token=ends)
            self._grammar_tokenizer = tokenizer
        return self._grammar_tokenizer

    def _scorer(self, n: int) -> Callable[[int], tuple[float, tuple[Candidate, ...]]]:
        """Reads the logits the token was just sampled from (before the next forward pass)."""

        return lambda token_id: score(self._last_logits(), token_id, n, self.piece)

    def _last_logits(self) -> npt.NDArray[np.float32]:
        import numpy as np

        n_vocab = int(self.llama.n_vocab())
        return np.ctypeslib.as_array(self.llama._ctx.get_logits_ith(-1), shape=(n_vocab,))

    def generate_batch(
        self, requests: Iterable[BatchRequest], parallel: int, n_ctx_seq: int
    ) -> Generator[BatchOutcome, None, None]:
        """Continuous batching (see :mod:`llmrun.backends.gguf_batch`); outcomes as they finish."""
        from llmrun.backends import gguf_batch

        return gguf_batch.generate(self, requests, parallel, n_ctx_seq)

    @property
    def batch_unsupported(self) -> str | None:
        return None  # llama.cpp batches any model it loads

    @property
    def drafts_alone(self) -> bool:
        """A draft model keeps one KV cache, following one sequence: this model then serves one request at a time."""
        return self.draft_model_drafter is not None

    def batch_decoder(self, parallel: int, n_ctx_seq: int, *, reuse_prefix: bool = False) -> Any:
        """A decoder for many sequences at once (see :class:`llmrun.backends.gguf_batch.BatchDecoder`)."""
        from llmrun.backends.gguf_batch import BatchDecoder

        return BatchDecoder(self, parallel, n_ctx_seq, reuse_prefix=reuse_prefix)

    def reset(self) -> None:
        self.llama.reset()

    def eval(self, ids: Sequence[int]) -> None:
        if self.llama.n_tokens + len(ids) > self.n_ctx:
            raise ContextFull(
                f"{self.llama.n_tokens + len(ids)} tokens do not fit in the context of {self.n_ctx}",
                "raise `n_ctx`",
            )
        self.llama.eval(list(ids))

    def logits(self, ids: Sequence[int]) -> npt.NDArray[np.float32]:
        """Raw next-token logits after ``ids`` (a fresh forward pass)."""
        import numpy as np

        self.reset()
        self.eval(ids)
        result: npt.NDArray[np.float32] = np.array(self._last_logits(), dtype=np.float32)
        return result

    def position_logits(self, ids: Sequence[int], chunk: int = 64) -> Iterator[npt.NDArray[np.float32]]:
        """Every position's logits, ``chunk`` positions a forward pass (llama-cpp-python's own
        ``eval`` keeps only the last row unless the whole context's rows are allocated)."""
        import numpy as np

        if len(ids) > self.n_ctx:
            raise ContextFull(f"{len(ids)} tokens do not fit in the context of {self.n_ctx}", "raise `n_ctx`")
        n_vocab = int(self.llama.n_vocab())
        chunk = max(1, min(chunk, self.llama.n_batch))
        self.reset()
        self.llama._ctx.kv_cache_clear()
        try:
            for start in range(0, len(ids), chunk):
                part = list(ids[start : start + chunk])
                self.llama._batch.set_batch(part, n_past=start, logits_all=True)
                self.llama._ctx.decode(self.llama._batch)
                rows = np.ctypeslib.as_array(self.llama._ctx.get_logits(), shape=(len(part) * n_vocab,))
                yield rows.reshape(len(part), n_vocab).copy()
        finally:
            self.llama._ctx.kv_cache_clear()
            self.reset()

    # looking inside the forward pass (llmrun look): llmrun.backends.gguf_look
    def geometry(self) -> Geometry:
        from llmrun.backends import gguf_look

        return gguf_look.geometry(self)

    def trace(self, ids: Sequence[int], layers: Sequence[int], top: int) -> Trace:
        from llmrun.backends import gguf_look

        return gguf_look.trace(self, ids, layers, top)

    def lens(self, hidden: npt.NDArray[np.float32], top: int) -> TopK:
        from llmrun.backends import gguf_look

        return gguf_look.lens(self, hidden, top)

    def embedding(self, ids: Sequence[int]) -> npt.NDArray[np.float32]:
        from llmrun.backends import gguf_look

        return gguf_look.embedding(self, ids)

    def embedding_rows(self, chunk: int = 16384) -> Iterator[tuple[int, npt.NDArray[np.float32]]]:
        from llmrun.backends import gguf_look

        return gguf_look.embedding_rows(self, chunk)

    def close(self) -> None:
        if self.projector is not None:
            self.projector.close()
            self.projector = None
        if self.draft_model_drafter is not None:
            self.draft_model_drafter.close()
            self.draft_model_drafter = None
        with contextlib.suppress(Exception):
            self.llama.close()


_KV_TYPES = {"f16": 1, "q4_0": 2, "q8_0": 8}  # GGML_TYPE_*


class GgufBackend:
    name = "gguf"

    def load(self, path: Path, params: LoadParams) -> GgufModel:
        from llama_cpp import Llama

        from llmrun.backends.llama_build import avoid_extra_buffers

        _route_llama_logs()
        if params.rpc:
            from llmrun.backends import ggml_rpc

            ggml_rpc.register(params.rpc)
        kv_type = _KV_TYPES[params.kv_type]
        try:
            with avoid_extra_buffers():
                llama = Llama(
                    model_path=str(path),
                    n_ctx=params.n_ctx,
                    n_threads=params.n_threads,
                    n_threads_batch=params.n_threads,
                    n_gpu_layers=params.n_gpu_layers,
                    vocab_only=params.vocab_only,
                    type_k=kv_type,
                    type_v=kv_type,
                    flash_attn=_flash_attention(path, params),
                    verbose=False,
                )
        except (ValueError, RuntimeError, OSError) as exc:
            raise BackendError(
                f"llama.cpp could not load {path.name}: {exc}",
                "the file may be corrupt or use an architecture this llama.cpp build does not know; "
                "try `debug`, or update llama-cpp-python",
            ) from exc
        return GgufModel(llama, path, params)


if TYPE_CHECKING:  # the capabilities this backend offers, as mypy checks them against the protocols

    def _capabilities(
        model: GgufModel,
    ) -> tuple[LoadedModel, Logits, Evaluates, GeneratesBatch, Speculates, Constrains, Looks, KeepsKv, SeesImages]:
        return model, model, model, model, model, model, model, model, model
