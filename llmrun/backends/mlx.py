"""The MLX backend: mlx-lm on Apple silicon (``mlx[cpu]`` on Linux, for correctness).

``mlx``/``mlx_lm`` are imported only when a model is loaded. :func:`make_sampler`
is the one place :class:`SamplingParams` becomes an MLX sampler (mlx-lm's own
filters, composed in llama.cpp's order so both backends mean the same thing by
the same flags) and :func:`make_processors` the one place for penalties.
Model code from a model directory never runs: ``trust_remote_code`` stays off.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmrun.backends.base import KeepPoint, LoadParams
from llmrun.backends.mlx_load import kept_tokenizer, markup_ids, on_the_cpu_in_float32, piece_decoder
from llmrun.backends.mlx_parts import PREFILL_STEP, make_processors, make_sampler
from llmrun.backends.mlx_vision import MlxImages
from llmrun.decoding.assembler import assemble, score, token_budget
from llmrun.decoding.events import BatchOutcome, BatchRequest, Candidate, Done, Token
from llmrun.decoding.sampling import SamplingParams
from llmrun.decoding.speculative import Draft
from llmrun.decoding.tokens import TokenKind, reusable
from llmrun.errors import BackendError, ContextFull, LlmrunError, UsageError
from llmrun.formats.mlx_header import is_mlx_dir
from llmrun.formats.mlx_runtime import prepare_mlx

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
    from llmrun.backends.mlx_vision import MlxVision
    from llmrun.backends.trace import Geometry, Looks, TopK, Trace
    from llmrun.models.kv_store import KvStore
    from llmrun.structured.grammar import Constrains, Constraint

KV_BITS = {"f16": None, "q8_0": 8, "q4_0": 4}
KV_GROUP_SIZE = 64
EOG_TEXTS = ("<end_of_turn>", "<|eot_id|>", "<|im_end|>", "<|endoftext|>", "<|end|>", "<|eom_id|>", "</s>")
"""Tokens that end a turn (llama.cpp's end-of-generation set), besides the configured EOS."""


class MlxModel(MlxImages):
    """A loaded MLX model; implements :class:`llmrun.backends.base.LoadedModel`."""

    def __init__(self, model: Any, tokenizer: Any, config: dict[str, Any], path: Path, params: LoadParams) -> None:
        self.model = model
        self.tokenizer = tokenizer  # transformers tokenizer
        self.config = config
        self.path = path
        self.n_ctx = params.n_ctx
        self.load_params = params
        self._spell = piece_decoder(tokenizer)
        self._special = set(tokenizer.all_special_ids) | markup_ids(tokenizer)
        self._pieces: dict[tuple[int, bool], bytes] = {}
        self._eog = self._end_ids()
        self._cache: list[Any] | None = None
        self._held: list[int] = []  # the tokens the cache holds, in order
        self.reused = 0  # prompt tokens the last stream took from the cache instead of evaluating
        self.kv_store: KvStore | None = None  # caches kept on disk (see use_kv_store)
        self.kv_point: KeepPoint = "prompt"
        self._grammar_tokenizer: Any = None
        self.draft = Draft()  # speculative decoding (see use_draft)
        self._draft_model: MlxModel | None = None
        self._vision_path: Path | None = None  # a vision model's own directory (see use_projector)
        self._vision: MlxVision | None = None  # its vision half, loaded on the first image

    def use_draft(self, draft: Draft, draft_model: LoadedModel | None = None) -> None:
        """Decode speculatively with a draft model (mlx-lm's ``speculative_generate_step``); its vocabulary
        is checked against this model's. Prompt lookup (``ngram``, ``auto``) is the GGUF backend's."""
        from llmrun.decoding.speculative import check_vocabulary

        if draft.on and draft.mode != "model":
            raise UsageError(
                f"`draft` {draft.mode} (prompt lookup) runs on the GGUF backend; MLX drafts with a draft model",
                "pass an MLX draft model with `draft`, or run a GGUF model",
            )
        if draft_model is not None:
            if not isinstance(draft_model, MlxModel):
                raise UsageError("an MLX model drafts for an MLX model", "pass an MLX draft model with `draft`")
            assert draft.model is not None
            check_vocabulary(self, draft_model, draft.model, (self.vocab_size, draft_model.vocab_size))
            if self._draft_model is not None:
                self._draft_model.close()
            self._draft_model = draft_model
        if draft.mode == "model" and self._draft_model is None:
            raise UsageError(f"draft model {draft.model} is not loaded", "pass it with `draft`")
        self.draft = draft

    # --- tokens ---------------------------------------------------------------
    def tokenize(self, text: str, *, special: bool = False, add_bos: bool = False) -> list[int]:
        backend = self.tokenizer.backend_tokenizer
        backend.encode_special_tokens = not special  # user text never becomes control tokens
        try:
            ids: list[int] = backend.encode(text, add_special_tokens=False).ids
        finally:
            backend.encode_special_tokens = False
        bos = self.bos_id
        return [bos, *ids] if add_bos and bos is not None else ids

    def token_bytes(self, token_id: int, *, special: bool = False) -> bytes:
        special = special or self.load_params.show_special
        key = (token_id, special)
        cached = self._pieces.get(key)
        if cached is None:
            token = self.tokenizer.convert_ids_to_tokens(int(token_id))
            if token is None:
                cached = b""
            elif token_id in self._special:
                cached = token.encode("utf-8") if special else b""
            else:
                cached = self._spell(token)
            self._pieces[key] = cached
        return cached

    def detokenize(self, ids: Sequence[int], *, special: bool = False) -> str:
        return b"".join(self.token_bytes(i, special=special) for i in ids).decode("utf-8", errors="replace")

    def token_kind(self, token_id: int) -> TokenKind:
        if token_id in self._special:
            return "control"
        return "user" if token_id in self.tokenizer.added_tokens_decoder else "normal"

    def _end_ids(self) -> set[int]:
        configured = self.config.get("eos_token_id")
        ends = set(configured if isinstance(configured, list) else [configured] if configured is not None else [])
        if self.tokenizer.eos_token_id is not None:
            ends.add(self.tokenizer.eos_token_id)
        backend = self.tokenizer.backend_tokenizer  # (get_vocab() builds a dict of the whole vocabulary)
        ends.update(found for text in EOG_TEXTS if (found := backend.token_to_id(text)) is not None)
        return ends

    def is_end(self, token_id: int) -> bool:
        return token_id in self._eog

    @property
    def bos_id(self) -> int | None:
        bos = self.tokenizer.bos_token_id
        return int(bos) if bos is not None else None

    @property
    def eos_id(self) -> int | None:
        eos = self.tokenizer.eos_token_id
        return int(eos) if eos is not None else None

    @property
    def adds_bos(self) -> bool:
        """Whether the tokenizer's post-processor puts BOS first (what the model was trained with)."""
        bos = self.bos_id
        return bos is not None and self.tokenizer.backend_tokenizer.encode("a", add_special_tokens=True).ids[:1] == [
            bos
        ]

    @property
    def vocab_size(self) -> int:
        return int(self.config.get("vocab_size") or len(self.tokenizer))

    def grammar_tokenizer(self) -> Any:
        """The vocabulary as llguidance reads it (from the fast tokenizer; every end-of-generation
        token ends a constrained answer), built on first use."""
        if self._grammar_tokenizer is None:
            from llguidance.hf import from_tokenizer

            self._grammar_tokenizer = from_tokenizer(
                self.tokenizer, n_vocab=self.vocab_size, eos_token=sorted(self._eog)
            )
        return self._grammar_tokenizer

    # --- the KV cache -----------------------------------------------------------
    def _new_cache(self) -> list[Any]:
        """mlx-lm's cache for the model, with --max-kv-size and --kv-bits applied where mlx-lm can."""
        from mlx_lm.models.cache import KVCache, QuantizedKVCache, RotatingKVCache, make_prompt_cache

        max_kv = self.load_params.max_kv_size
        cache = make_prompt_cache(self.model, max_kv_size=max_kv)
        bits = KV_BITS[self.load_params.kv_type]
        for i, layer in enumerate(cache):
            if max_kv and type(layer) is KVCache:  # models with their own make_cache ignore max_kv_size
                cache[i] = layer = RotatingKVCache(max_size=max_kv, keep=4)
            if bits and type(layer) is KVCache:
                cache[i] = QuantizedKVCache(group_size=KV_GROUP_SIZE, bits=bits)
        return cache

    # --- the KV store (mlx-lm's prompt-cache files as the payload) ------------------
    def kv_settings(self) -> dict[str, Any]:
        from importlib.metadata import version

        return {
            "backend": "mlx",
            "engine": f"mlx-lm {version('mlx-lm')}",
            "kv_type": self.load_params.kv_type,
            "max_kv_size": self.load_params.max_kv_size,
        }

    def use_kv_store(self, store: KvStore | None) -> None:
        """Keep what generations evaluate in ``store`` and start prompts from it (None: stop). A rotating cache
        (a sliding window, ``max_kv_size``) cannot be cut back, so its kept prefixes are used whole."""
        if store is not None:
            store.whole = any(type(layer).__name__ == "RotatingKVCache" for layer in self._new_cache())
        self.kv_store = store

    def keep_at(self, point: KeepPoint) -> None:
        self.kv_point = point

    def _start_from_store(self, ids: Sequence[int]) -> int:
        """Take the cache from the KV store when it holds more of ``ids`` than this one, cut it to what ``ids``
        reuses, and keep the prompt's boundaries the store wants (where it leaves a kept prefix, its last
        token, each evaluated and kept); how many prompt tokens were spared."""
        import mlx.core as mx

        from llmrun.backends.mlx_parts import cache_from_bytes, cache_to_bytes

        store = self.kv_store
        if store is not None:
            found = store.lookup(ids, better_than=reusable(self._held, ids) if self._cache is not None else 0)
            payload = store.load(found[0]) if found is not None else None
            cache = cache_from_bytes(payload) if payload is not None else None
            if found is not None and cache is not None and len(cache) == len(self._new_cache()):
                self._cache, self._held = cache, list(found[0].tokens)
        held = spared = self._prepare(ids)
        if store is None or self.kv_point != "prompt" or len(ids) >= self.n_ctx:
            return spared
        for point in (store.branch(ids), len(ids) - 1):
            if point > held and store.wanted(ids[:point]):
                for out in self._forward(ids[held:point]):
                    mx.eval(out)
                store.save(ids[:point], cache_to_bytes(self._cache or []))
                held = point
        return spared

    def _keep_answer(self) -> None:
        """Keep the cache a conversation's turn left (its prompt and answer), replacing the turn before."""
        if self.kv_store is None or self.kv_point != "answer" or self._cache is None:
            return
        from llmrun.backends.mlx_parts import cache_to_bytes

        tokens = self._held[: self._cache[0].offset]
        if self.kv_store.wanted(tokens):
            self.kv_store.save(tokens, cache_to_bytes(self._cache), replace_shorter=True)

    def _prepare(self, ids: Sequence[int]) -> int:
        """Reuse the cached prefix of ``ids``; returns how many leading tokens are already in the cache."""
        from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

        keep = reusable(self._held, ids)  # the last prompt token is always evaluated, for its logits
        if self._cache is not None and keep > 0:
            surplus = len(self._held) - keep
            if surplus == 0 or (can_trim_prompt_cache(self._cache) and trim_prompt_cache(self._cache, surplus)):
                self._held = self._held[:keep]
                return keep
        self.reset()
        return 0

    def reset(self) -> None:
        self._cache = self._new_cache()
        self._held = []

    def eval(self, ids: Sequence[int]) -> None:
        import mlx.core as mx

        if self._cache is None:
            self.reset()
        if len(self._held) + len(ids) > self.n_ctx:
            raise ContextFull(
                f"{len(self._held) + len(ids)} tokens do not fit in the context of {self.n_ctx}", "raise `n_ctx`"
            )
        for out in self._forward(ids):
            mx.eval(out)

    # --- generation -----------------------------------------------------------
    def stream(
        self, ids: Sequence[int], params: SamplingParams, *, logprobs: int = 0, constraint: Constraint | None = None
    ) -> Iterator[Token | Done]:
        import mlx.core as mx

        seed = params.run_seed()
        if seed is not None:
            mx.random.seed(seed)
        ids = list(ids)
        if self.draft.on and self._draft_model is not None:
            yield from self._speculative(ids, params, seed, logprobs, constraint)
            return
        started = time.perf_counter()
        start = self.reused = self._start_from_store(ids)
        yield from self._sample(ids, ids, start, params, seed, logprobs, constraint, started)
        self._keep_answer()

    def _sample(
        self,
        ids: list[int],
        held: list[int],
        start: int,
        params: SamplingParams,
        seed: int | None,
        logprobs: int,
        constraint: Constraint | None,
        started: float,
        embeddings: Any = None,
    ) -> Iterator[Token | Done]:
        """Sample after the prompt ``ids``, of which the cache holds the first ``start``; ``held``: what the
        cache will be said to hold for them (an image's positions by its keys); ``embeddings``: the prompt's
        input embeddings, where it has images."""
        import mlx.core as mx
        from mlx_lm.generate import generate_step

        suffix = ids[start:]
        last: dict[str, Any] = {}

        def sampled() -> Generator[int, None, None]:
            steps = generate_step(
                mx.array(suffix),
                self.model,
                max_tokens=-1,
                sampler=make_sampler(params, self.vocab_size),
                logits_processors=make_processors(params, self.n_ctx, len(suffix), constraint),
                prompt_cache=self._cache,
                prefill_step_size=PREFILL_STEP,
                input_embeddings=None if embeddings is None else embeddings[start:],
            )
            self._held = list(held)  # generate_step feeds the whole suffix, then every token it yields
            try:
                for token, token_logprobs in steps:
                    self._held = [*self._held, int(token)]
                    last["logprobs"] = token_logprobs
                    yield int(token)
            finally:
                steps.close()

        yield from assemble(
            sampled(),
            self.token_bytes,
            self.is_end,
            prompt_tokens=len(ids),
            n_ctx=self.n_ctx,
            params=params,
            seed=seed,
            score=self._scorer(last, logprobs) if logprobs > 0 else None,
            cached_tokens=start,
            constraint=constraint,
            started=started,
        )

    def _speculative(
        self, ids: list[int], params: SamplingParams, seed: int | None, logprobs: int, constraint: Constraint | None
    ) -> Iterator[Token | Done]:
        """``stream`` with the draft model: mlx-lm drafts ``draft.tokens`` tokens a round and the model
        checks them in one pass. Both evaluate the prompt whole, in caches of this request's own (the model's
        prefix cache is left as it was). mlx-lm reports the tokens the model kept from the draft; each round
        drafts ``draft.tokens`` and ends with a token of the model's own, so the rounds give what was drafted.
        The model samples each position itself and keeps the draft while they agree, so the output has the
        model's distribution whatever the draft's."""
        import mlx.core as mx
        from mlx_lm.generate import speculative_generate_step

        from llmrun.decoding.speculative import Tally

        assert self._draft_model is not None
        budget, _ = token_budget(len(ids), self.n_ctx, params)
        last: dict[str, Any] = {}
        tally = Tally()
        self.reused = 0

        def sampled() -> Generator[int, None, None]:
            assert self._draft_model is not None
            steps = speculative_generate_step(
                mx.array(ids),
                self.model,
                self._draft_model.model,
                num_draft_tokens=self.draft.tokens,
                max_tokens=budget,  # mlx-lm drafts min(what is left, num_draft_tokens): it needs the real limit
                sampler=make_sampler(params, self.vocab_size),
                logits_processors=make_processors(params, self.n_ctx, len(ids), constraint),
                prompt_cache=self._new_cache() + self._draft_model._new_cache(),
                prefill_step_size=PREFILL_STEP,
            )
            try:
                for token, token_logprobs, from_draft in steps:
                    if from_draft:
                        tally.accepted += 1
                    else:  # a round's own token: the round drafted draft.tokens
                        tally.drafted += self.draft.tokens
                        tally.steps += 1
                    last["logprobs"] = token_logprobs
                    yield int(token)
            finally:
                steps.close()

        yield from assemble(
            sampled(),
            self.token_bytes,
            self.is_end,
            prompt_tokens=len(ids),
            n_ctx=self.n_ctx,
            params=params,
            seed=seed,
            score=self._scorer(last, logprobs) if logprobs > 0 else None,
            constraint=constraint,
            tally=tally,
        )

    def _scorer(self, last: dict[str, Any], n: int) -> Callable[[int], tuple[float, tuple[Candidate, ...]]]:
        """Scores each token from the log-probabilities generate_step sampled it from."""
        import mlx.core as mx
        import numpy as np

        def logits() -> npt.NDArray[np.float32]:
            return np.array(last["logprobs"].astype(mx.float32), dtype=np.float32)

        return lambda token_id: score(logits(), token_id, n, self.token_bytes)

    def logits(self, ids: Sequence[int]) -> npt.NDArray[np.float32]:
        """Raw next-token logits after ``ids`` (a fresh forward pass)."""
        chunks = list(self.position_logits(ids))
        last: npt.NDArray[np.float32] = chunks[-1][-1]
        return last

    def position_logits(self, ids: Sequence[int]) -> Iterator[npt.NDArray[np.float32]]:
        """Logits after each prefix of ``ids``, a chunk (positions × vocabulary) at a time."""
        import mlx.core as mx
        import numpy as np

        self.reset()
        for out in self._forward(ids):
            yield np.array(out[0].astype(mx.float32), dtype=np.float32)

    # looking inside the forward pass (llmrun look): llmrun.backends.mlx_look
    def geometry(self) -> Geometry:
        from llmrun.backends import mlx_look

        return mlx_look.geometry(self)

    def trace(self, ids: Sequence[int], layers: Sequence[int], top: int) -> Trace:
        from llmrun.backends import mlx_look

        return mlx_look.trace(self, ids, layers, top)

    def lens(self, hidden: npt.NDArray[np.float32], top: int) -> TopK:
        from llmrun.backends import mlx_look

        return mlx_look.lens(self, hidden, top)

    def embedding(self, ids: Sequence[int]) -> npt.NDArray[np.float32]:
        from llmrun.backends import mlx_look

        return mlx_look.embedding(self, ids)

    def embedding_rows(self, chunk: int = 16384) -> Iterator[tuple[int, npt.NDArray[np.float32]]]:
        from llmrun.backends import mlx_look

        return mlx_look.embedding_rows(self, chunk)

    def _forward(self, ids: Sequence[int]) -> Iterator[Any]:
        """Feeds ``ids`` into the cache a prefill step at a time; yields each step's logits (lazy)."""
        import mlx.core as mx

        for start in range(0, len(ids), PREFILL_STEP):
            chunk = list(ids[start : start + PREFILL_STEP])
            out = self.model(mx.array(chunk)[None], cache=self._cache)
            self._held += chunk
            yield out

    def batch_decoder(self, parallel: int, n_ctx_seq: int, *, reuse_prefix: bool = False) -> Any:
        """Many sequences at once through mlx-lm's BatchGenerator (:mod:`llmrun.backends.mlx_batch`);
        its caches are its own, so there is no prefix reuse across requests."""
        from llmrun.backends.mlx_batch import MlxBatchDecoder

        if self.batch_unsupported is not None:
            return None
        return MlxBatchDecoder(self, parallel, n_ctx_seq)

    @property
    def drafts_alone(self) -> bool:
        """False: mlx-lm's batch generator decodes without the draft model, so batching goes on as before."""
        return False

    @property
    def batch_unsupported(self) -> str | None:
        """Why mlx-lm's batch generator cannot run this model as loaded (None: it can)."""
        if KV_BITS[self.load_params.kv_type]:
            return "mlx-lm's batch generator has no quantized KV cache (`kv_type`)"
        if self.load_params.max_kv_size:
            return "mlx-lm's batch generator does not take llmrun's rotating cache (`max_kv_size`)"
        return None

    def generate_batch(
        self, requests: Iterable[BatchRequest], parallel: int, n_ctx_seq: int
    ) -> Generator[BatchOutcome, None, None]:
        """One request after another (the batch command; the server batches through :meth:`batch_decoder`)."""
        for request in requests:
            done: Done | None = None
            try:
                for event in self.stream(request.ids, request.params):
                    if isinstance(event, Done):
                        done = event
            except LlmrunError as exc:  # this request cannot run (its prompt does not fit, …); the rest go on
                yield BatchOutcome(request.index, None, exc)
                continue
            yield BatchOutcome(request.index, done)

    def close(self) -> None:
        import mlx.core as mx

        if self._draft_model is not None:
            self._draft_model.close()
            self._draft_model = None
        self._cache = None
        self.model = None
        mx.clear_cache()


def expand_on_cpu(config: dict[str, Any]) -> bool:
    """Whether a quantized model's weights are expanded to bfloat16 at load (to float32 with a fast
    BLAS, see :func:`llmrun.backends.mlx_load.on_the_cpu_in_float32`): on the CPU only.

    mlx's CPU kernels for quantized matrix products are slow (about 3 s a token for the 270M
    test model, against 0.4 s expanded) and inexact (next-token KL to the source GGUF 0.23,
    against 0.013 for the same quantized values expanded); Apple GPUs have fast, exact ones.
    """
    import mlx.core as mx

    return "quantization" in config and mx.default_device() == mx.cpu


class MlxBackend:
    name = "mlx"

    def load(self, path: Path, params: LoadParams) -> MlxModel:
        blas = prepare_mlx()
        try:
            from mlx_lm.utils import load_config, load_model, load_tokenizer
        except ImportError as exc:
            from llmrun.backends import mlx_missing

            raise mlx_missing() from exc
        if not is_mlx_dir(path):
            raise BackendError(
                f"{path} is not an MLX model directory (config.json and *.safetensors)",
                f"convert a GGUF first: llmrun convert {path} --to mlx",
            )
        try:
            config = load_config(path)
            eos = config.get("eos_token_id")
            tokenizer = kept_tokenizer(path, tuple(eos) if isinstance(eos, list) else None, load_tokenizer)
            model = None
            if not params.vocab_only:
                model, config = load_model(path, lazy=False, strict=True, trust_remote_code=False)
                if expand_on_cpu(config):
                    from mlx_lm.utils import dequantize_model

                    model = dequantize_model(model)
                on_the_cpu_in_float32(model, blas)
        except (ValueError, FileNotFoundError, OSError, KeyError) as exc:
            raise BackendError(
                f"mlx-lm could not load {path.name}: {exc}",
                "the directory may be incomplete or of an architecture this mlx-lm does not know; try `debug`",
            ) from exc
        return MlxModel(model, tokenizer, config, path, params)


if TYPE_CHECKING:  # the capabilities this backend offers, as mypy checks them against the protocols

    def _capabilities(
        model: MlxModel,
    ) -> tuple[LoadedModel, Logits, Evaluates, GeneratesBatch, Speculates, Constrains, Looks, KeepsKv, SeesImages]:
        return model, model, model, model, model, model, model, model, model
