"""What a running server holds: its settings, the engine, one scheduler per loaded model.

A client's model name is looked up among the names the operator gave (``-m``), then
resolved through the registry and the store like the CLI does — but never as a file
path or URL, and never downloaded unless the operator passed ``--allow-pull``.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmrun.api import openai as api
from llmrun.api.errors import worded
from llmrun.decoding.sampling import SamplingParams
from llmrun.engine.core import Engine
from llmrun.engine.once import MadeOnce
from llmrun.engine.scheduler import Scheduler
from llmrun.errors import InsufficientMemory, LlmrunError, ModelNotFound, UsageError
from llmrun.models.refs import ModelRef
from llmrun.remote.model import RemoteModel
from llmrun.remote.proxy import RemoteProxy
from llmrun.server.workers import Workers

if TYPE_CHECKING:
    from llmrun.backends.base import Embedder
    from llmrun.decoding.speculative import Draft
    from llmrun.engine.plan import RunPlan
    from llmrun.server.image_urls import UrlPolicy

log = logging.getLogger(__name__)
LOAD_WAIT_S = 60.0  # how long a load waits for busy models to make room before it is a 503
SYSTEM_ROOM = 1024**3  # memory left to the system by the default budget


def _default_budget() -> int:
    """The memory the loaded models may take when --max-memory does not say: what is free now, less room for
    the system."""
    from llmrun.sysinfo import available_memory

    return max(0, available_memory() - SYSTEM_ROOM)


@dataclass(frozen=True, slots=True)
class ServerConfig:
    models: tuple[str, ...] = ()  # loaded at start; the first is the default
    parallel: int = 4  # sequences decoded together per model
    n_ctx: int | None = None  # context per sequence (None: the model's default, at most 4096)
    load_flags: dict[str, Any] = field(default_factory=dict)  # threads, gpu layers, kv type
    backend: str = "auto"
    api_key: str | None = None
    keep_alive: float | None = None  # seconds a model stays loaded after its last request (None: forever)
    max_models: int | None = None  # text models loaded at once (None: as many as the memory budget holds)
    max_memory: int | None = None  # bytes the loaded models may take, as planned (None: what is free at start
    # less room for the system)
    max_queue: int = 64  # waiting requests per model before 503
    max_connections: int = 256  # open connections and requests at once before 503 (uvicorn's limit_concurrency)
    max_body_bytes: int = 4 * 1024 * 1024
    max_n: int = 8
    max_tokens: int = 2048  # an answer's tokens when a request names none, and the most it may name
    request_timeout: float | None = 300.0  # seconds a request may take, waiting included (None: no limit)
    allow_pull: bool = False
    cors_origins: tuple[str, ...] = ()  # browser origins answered besides the server's own ('*': every one)
    allowed_hosts: tuple[str, ...] | None = ()  # Host names answered besides loopback ones (None: any name)
    force: bool = False
    cache_prompts: bool = True  # keep finished requests' KV cells for the next request sharing their prefix
    template: tuple[str, str] | None = None  # --template: the chat template every model uses, and its source
    draft: Draft | None = None  # --draft: speculative decoding for every model (None: each model's models.toml)
    kv_cache: tuple[int | None, str] = (None, "default")  # the KV store's limit in bytes (None: off), and its source
    ui: bool = True  # the page at / (serve --no-ui: off)
    mmproj: tuple[str, Path] | None = None  # a model's projector (serve --mmproj: the first -m model's): it sees images
    image_urls: UrlPolicy | None = None  # --allow-image-urls: which http(s) image URLs may be fetched (None: none)


@dataclass
class Embedding:
    """A loaded embedding model (one request at a time: embedding is one forward pass per batch)."""

    name: str
    embedder: Embedder
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class Served:
    name: str  # as the server reports it
    scheduler: Scheduler | RemoteProxy  # (a proxy: a models.toml entry whose engine is elsewhere)
    defaults: SamplingParams
    n_ctx: int
    keep_alive: float | None = None  # seconds it stays loaded after its last request (None: forever): the
    # latest request's keep_alive, else the server's --keep-alive
    memory: int = 0  # bytes, as planned: weights + the KV cache at its slots + overhead (0: a remote engine's)

    @property
    def idle(self) -> bool:
        return not (self.scheduler.queued or self.scheduler.busy)

    @property
    def remote(self) -> bool:
        """Served by an engine elsewhere: it renders the template and reads tool calls itself."""
        return isinstance(self.scheduler.entry.model, RemoteModel)


@dataclass(frozen=True, slots=True)
class Load:
    """How busy the server is: slots (sequences decoded at once; before a model loads, the number
    it will get), those decoding, and the requests waiting for one."""

    slots: int
    busy: int
    queued: int


class ServerState:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.engine = Engine(template=config.template)
        self._served: dict[str, Served] = {}  # by every name it answers to
        self._embeddings: dict[str, Embedding] = {}
        self._lock = threading.Lock()  # the tables only: never held through a load
        self._made_served = MadeOnce(self._served, self._lock)  # loads outside the lock, one per name
        self._made_embeddings = MadeOnce(self._embeddings, self._lock)
        self._given = public_names(config.models)  # a model given by path: its file name → the path
        # slow work in worker threads, each kind bounded (past the bound: a 503 with Retry-After)
        self.loading = Workers("waiting for a model to load", threads=2, queue=config.max_queue)
        self.preparing = Workers(
            "being prepared (templates rendered, prompts tokenized, images read)", threads=4, queue=4 * config.max_queue
        )
        self.embedding = Workers("waiting for an embedding model", threads=2, queue=config.max_queue)
        self._reserved: dict[str, int] = {}  # memory of the loads under way, by name
        self.budget = config.max_memory if config.max_memory is not None else _default_budget()
        self.closing = False
        self._closed = False
        self._close_lock = threading.Lock()
        self._close_done = threading.Event()

    def limits(self, served: Served | None = None) -> api.Limits:
        """What one request may ask for: ``max_tokens`` up to the operator's --max-tokens and the context."""
        n_ctx = served.n_ctx if served is not None else min((s.n_ctx for s in self.served()), default=1)
        ceiling = min(self.config.max_tokens, n_ctx)
        return api.Limits(
            max_tokens=ceiling,
            max_n=self.config.max_n,
            default_tokens=ceiling,
            request_timeout_s=self.config.request_timeout,
        )

    def served(self) -> list[Served]:
        with self._lock:
            return list({id(s): s for s in self._served.values()}.values())

    def load(self) -> Load:
        served = self.served()
        if not served:
            return Load(self.config.parallel, 0, 0)
        slots = sum(s.scheduler.parallel if s.scheduler.batching else 1 for s in served)
        return Load(slots, sum(s.scheduler.busy for s in served), sum(s.scheduler.queued for s in served))

    def find(self, name: str) -> Served | None:
        """The model of that name if it is loaded now (never blocks on a load: the event loop may call it)."""
        with self._lock:
            return self._served.get(self._given.get(name, name))

    def find_embedding(self, name: str) -> Embedding | None:
        with self._lock:
            return self._embeddings.get(self._given.get(name, name))

    def get(self, name: str, *, operator: bool = False) -> Served:
        """The model a client named, loaded on first use (blocking: call from a worker thread).
        ``operator``: a name from the command line, which may be a path. The table's lock is held only
        to look up and to record: one load per name at a time, other names and every reader meanwhile."""
        name = self._given.get(name, name)  # a file's name → the path the operator gave
        check = lambda: self._check_name(name, operator)  # noqa: E731
        return self._made_served.get(name, lambda: self._load(name), check=check, aliases=lambda s: (s.name,))

    def _check_name(self, name: str, operator: bool) -> None:
        """A client's name must not be a path or URL; the operator's (-m) may, and stay servable once unloaded."""
        if not operator and name not in self.config.models:
            _check_client_name(name)

    def names(self) -> list[str]:
        """Every model name this server answers to now or will load: what /v1/models lists (a model the
        operator gave by path under its file name: a client never sees where files lie)."""
        loaded = {s.name for s in self.served()} | {e.name for e in self.embeddings()}
        return sorted(loaded | {self.public_name(name) for name in self.config.models})

    def public_name(self, name: str) -> str:
        """What clients call a model the operator named: a path's file name, else the name itself."""
        return next((public for public, given in self._given.items() if given == name), name)

    def untagged(self, name: str) -> str:
        """``NAME:latest`` for a served ``NAME`` that has no tag: Ollama's clients (Open WebUI among them)
        tag a tagless name with ``:latest`` before they ask for it."""
        base = name.removesuffix(":latest")
        if base == name:
            return name
        names = self.names()
        return base if name not in names and base in names else name

    def embeddings(self) -> list[Embedding]:
        with self._lock:
            return list({id(e): e for e in self._embeddings.values()}.values())

    def get_embedding(self, name: str, *, operator: bool = False) -> Embedding:
        """The embedding model a client named, loaded on first use (blocking)."""
        name = self._given.get(name, name)

        def load(name: str) -> Embedding:
            from llmrun.models.registry import load_registry
            from llmrun.rag.embedding import embedding_model

            model = embedding_model(load_registry(), name)
            return Embedding(self.public_name(name) if name in self._given.values() else model.name, model.open())

        check = lambda: self._check_name(name, operator)  # noqa: E731
        return self._made_embeddings.get(name, lambda: load(name), check=check, aliases=lambda e: (e.name,))

    def load_at_start(self) -> list[Served | Embedding]:
        """The models named with -m: text models get a scheduler, embedding models an embedder."""
        return [
            self.get_embedding(name, operator=True) if _is_embedding(name) else self.get(name, operator=True)
            for name in self.config.models
        ]

    def _load(self, name: str) -> Served:
        from llmrun.engine.load import check_parallel_memory, load_defaults, parallel_memory
        from llmrun.engine.plan import plan_run
        from llmrun.models.registry import load_registry
        from llmrun.sysinfo import available_memory

        flags = {k: v for k, v in self.config.load_flags.items() if v is not None}
        if self.config.n_ctx is not None:
            flags["n_ctx"] = self.config.n_ctx

        def planned(model: str) -> RunPlan:
            return plan_run(
                load_registry(),
                model,
                {},
                flags,
                force=self.config.force,
                available_memory=available_memory,
                load_defaults=load_defaults,
                backend=self.config.backend,
                draft=self.config.draft,
                kv_cache=self.config.kv_cache,
            )

        try:
            run_plan = planned(name)
        except LlmrunError:  # not in llmrun's store, and not to be pulled (offline, or not pullable)
            if not in_ollama(name):
                raise
            run_plan = planned(f"ollama:{name}")  # a drop-in for Ollama: the models it already has
        listed = run_plan.model.projector  # the operator's models.toml, pulled with it, or another store's
        if self.config.mmproj is not None and name == self.config.mmproj[0]:
            run_plan = dataclasses.replace(run_plan, mmproj=self.config.mmproj[1])
        elif listed is not None:
            run_plan = dataclasses.replace(run_plan, mmproj=listed[0], mmproj_source=listed[1])
        if run_plan.backend == "remote":  # a proxy: the engine there renders, schedules and batches
            entry = self.engine.load(run_plan)
            proxy = RemoteProxy(entry, self.config.parallel, self.config.max_queue, timeout=self.config.request_timeout)
            public = self.public_name(run_plan.model.name)
            return Served(public, proxy, run_plan.sampling, run_plan.load.n_ctx, self.config.keep_alive)
        needed = parallel_memory(run_plan, self.config.parallel)
        self._make_room(name, needed)
        try:
            forced = check_parallel_memory(run_plan, self.config.parallel, available_memory(), force=self.config.force)
            for warning in [*run_plan.warnings, *([forced] if forced else [])]:
                log.warning("%s: %s", name, worded(warning))
            entry = self.engine.load(run_plan)
        finally:
            with self._lock:
                self._reserved.pop(name, None)
        config = self.config
        scheduler = Scheduler(
            entry,
            config.parallel,
            run_plan.load.n_ctx,
            config.max_queue,
            cache_prompts=config.cache_prompts,
            timeout=config.request_timeout,
        )
        served_as = name if run_plan.model.foreign and not name.startswith(("ollama:", "lmstudio:")) else None
        if name in self._given.values():
            served_as = self.public_name(name)
        public = served_as or run_plan.model.name
        return Served(public, scheduler, run_plan.sampling, run_plan.load.n_ctx, self.config.keep_alive, needed)

    def _make_room(self, name: str, needed: int) -> None:
        """Room for a model of ``needed`` bytes within --max-models and the memory budget: the least recently
        used idle models unloaded until it fits (never one with requests running or queued: while only busy
        ones stand in the way, the load waits for them, up to :data:`LOAD_WAIT_S`)."""
        from llmrun.units import format_bytes

        limit = self.config.max_models
        if needed > self.budget:
            raise InsufficientMemory(
                f"{name} needs about {format_bytes(needed)} at {self.config.parallel} slots, more than the "
                f"{format_bytes(self.budget)} this server may use",
                "raise --max-memory, or lower --parallel or --ctx",
            )
        deadline = time.monotonic() + LOAD_WAIT_S
        while True:
            with self._lock:
                loaded = [s for s in {id(s): s for s in self._served.values()}.values() if s.memory]
                used = sum(s.memory for s in loaded) + sum(self._reserved.values())
                count = len(loaded) + len(self._reserved)
                if used + needed <= self.budget and (limit is None or count < limit):
                    self._reserved[name] = needed
                    return
                idle = sorted((s for s in loaded if s.idle), key=lambda s: s.scheduler.entry.last_used)
                victim = next((s for s in idle if s.scheduler.stop_if_idle()), None)
                if victim is not None:
                    for key in [k for k, v in self._served.items() if v is victim]:
                        del self._served[key]
            if victim is not None:
                victim.scheduler.close()
                self.engine.unload(victim.scheduler.entry.name)
                log.info("unloaded %s to make room for %s (--max-models, --max-memory)", victim.name, name)
                continue
            if time.monotonic() > deadline:
                raise InsufficientMemory(
                    f"{name} waits for room: the models loaded are all answering requests",
                    "retry in a moment, or raise --max-models or --max-memory",
                )
            time.sleep(0.1)

    def keep(self, served: Served, keep_alive: float | str | None) -> None:
        """How long ``served`` stays loaded after this request: seconds, None (forever), or ``"default"``
        (the server's --keep-alive), as the latest request says (Ollama's rule)."""
        served.keep_alive = self.config.keep_alive if isinstance(keep_alive, str) else keep_alive

    def expires_in(self, served: Served, now: float | None = None) -> float | None:
        """Seconds until ``served`` is unloaded if nothing asks for it (None: never)."""
        if served.keep_alive is None:
            return None
        now = time.monotonic() if now is None else now
        return max(0.0, served.keep_alive - (now - served.scheduler.entry.last_used))

    def unload(self, name: str) -> bool:
        """Unload the model of that name now, or as soon as its requests end: whether it was loaded."""
        served = self.find(name)
        if served is None:
            return False
        served.keep_alive = 0.0
        self.expire()
        return True

    def expire(self, now: float | None = None) -> list[str]:
        """Unload models idle (nothing queued or running) for longer than their keep-alive; their names."""
        now = time.monotonic() if now is None else now
        with self._lock:
            idle = [
                served
                for served in {id(s): s for s in self._served.values()}.values()
                if served.keep_alive is not None
                and now - served.scheduler.entry.last_used >= served.keep_alive
                and served.scheduler.stop_if_idle()  # (last: it stops the scheduler taking requests)
            ]
            for key in [k for k, v in self._served.items() if any(v is s for s in idle)]:
                del self._served[key]  # (in place: the table's makings keep it)
        for served in idle:  # outside the table's lock: requests for other models go on meanwhile
            served.scheduler.close()
            self.engine.unload(served.scheduler.entry.name)
        return [served.name for served in idle]

    def close(self) -> None:
        """Stop every scheduler (requests in flight get an error event; the slots' cells go to the KV store),
        then unload: once, from any thread; a second caller waits until the first has finished."""
        with self._close_lock:
            closing_elsewhere = self._closed
            self._closed = True
        if closing_elsewhere:
            self._close_done.wait()
            return
        self.closing = True
        try:
            for served in self.served():
                served.scheduler.close()
            self.engine.close()
            for embedding in self.embeddings():
                with embedding.lock:
                    embedding.embedder.close()
        finally:
            self._close_done.set()


def public_names(models: tuple[str, ...]) -> dict[str, str]:
    """The operator's models given by path, by the file name clients know them by (``-m ~/m/gemma.gguf``:
    ``gemma.gguf``); two paths with one file name are a UsageError naming both."""
    found: dict[str, str] = {}
    for name in models:
        if ModelRef.parse(name).kind != "path":
            continue
        public = Path(name).expanduser().name or name
        other = found.get(public)
        if other is not None and other != name:
            raise UsageError(
                f"two models would be served as {public}: {other} and {name}",
                "serve one of them, or copy one to another file name",
            )
        if public in models and public != name:
            raise UsageError(f"{name} would be served as {public}, which is also a -m name", "rename one of them")
        found[public] = name
    return found


def _is_embedding(name: str) -> bool:
    from llmrun.engine.plan import locate
    from llmrun.formats.gguf_header import is_embedding_model
    from llmrun.models.registry import load_registry

    if Path(name).expanduser().is_dir():
        from llmrun.backends.mlx_embed import is_bert_dir

        return is_bert_dir(Path(name).expanduser())
    registry = load_registry()
    entry = registry.get(name)
    if entry is not None and entry.remote:
        return False  # served through a proxy: a chat or completions engine
    return is_embedding_model(locate(registry, name, backend="gguf").header)


def in_ollama(name: str) -> bool:
    """Whether Ollama's store has a model of this name (a client of Ollama's API names it as Ollama does)."""
    from llmrun.models.otherstores import ollama_dir, ollama_parts

    try:
        host, namespace, model, tag = ollama_parts(name)
    except ModelNotFound:
        return False
    return (ollama_dir() / "manifests" / host / namespace / model / tag).is_file()


def _check_client_name(name: str) -> None:
    """A client's model name never becomes a path or URL."""
    if "://" in name or "\\" in name or ".." in name or ModelRef.parse(name).kind == "path":
        raise ModelNotFound(f"model {name!r} is not served here (file paths and URLs are not)")
