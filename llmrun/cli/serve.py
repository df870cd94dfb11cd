"""``llmrun serve``: the OpenAI HTTP API on this machine."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from llmrun.cli import options as o
from llmrun.errors import UsageError
from llmrun.models.endpoint import is_loopback
from llmrun.units import parse_size

if TYPE_CHECKING:
    from llmrun.server.image_urls import UrlPolicy
    from llmrun.server.state import ServerConfig

SERVER = "Server"
KEY_ENV = "LLMRUN_API_KEY"


def serve(
    model: Annotated[
        list[str] | None,
        typer.Option(
            "--model",
            "-m",
            help="A model to load at start (repeatable); the first is listed first. Default: the default model.",
            rich_help_panel=o.LOADING,
            show_default=False,
        ),
    ] = None,
    template: o.TemplateOpt = None,
    host: Annotated[str, typer.Option("--host", help="Address to bind.", rich_help_panel=SERVER)] = "127.0.0.1",
    port: Annotated[
        int | None,
        typer.Option(
            "--port", "-p", min=0, max=65535, help="Default: 8080 (11434 with --ollama).", rich_help_panel=SERVER
        ),
    ] = None,
    ollama: Annotated[
        bool,
        typer.Option(
            "--ollama",
            help="Listen on Ollama's port (11434), so tools wired to Ollama use llmrun unchanged.",
            rich_help_panel=SERVER,
        ),
    ] = False,
    parallel: Annotated[
        int, typer.Option("--parallel", "-P", min=1, max=64, help="Requests decoded together per model.")
    ] = 4,
    ctx: Annotated[
        int | None,
        typer.Option(
            "--ctx",
            "-c",
            help="Context per request. Default: the model's trained length, at most 4096.",
            rich_help_panel=o.LOADING,
            show_default=False,
        ),
    ] = None,
    threads: o.ThreadsOpt = None,
    gpu_layers: o.GpuLayersOpt = None,
    kv_bits: o.KvBitsOpt = None,
    flash_attn: o.FlashAttnOpt = None,
    backend: o.BackendOpt = "auto",
    rpc: o.RpcOpt = None,
    rpc_allow_remote: o.RpcAllowRemoteOpt = False,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            help=f"Require this key (Authorization: Bearer KEY). It shows in the process list: prefer "
            f"--api-key-file or ${KEY_ENV}.",
            rich_help_panel=SERVER,
            show_default=False,
        ),
    ] = None,
    api_key_file: Annotated[
        Path | None,
        typer.Option("--api-key-file", help="Read the key from this file.", rich_help_panel=SERVER, show_default=False),
    ] = None,
    no_auth: Annotated[
        bool,
        typer.Option("--no-auth", help="Allow a non-loopback bind without a key.", rich_help_panel=SERVER),
    ] = False,
    cors_origin: Annotated[
        list[str] | None,
        typer.Option(
            "--cors-origin",
            help="Answer web pages of this origin (http://HOST:PORT; repeatable; '*': every page on the web). "
            "Default: only the server's own page.",
            rich_help_panel=SERVER,
            show_default=False,
        ),
    ] = None,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allowed-host",
            metavar="NAME",
            help="Answer requests sent to this host name too (repeatable; '*': any). Default on a loopback bind: "
            "localhost, *.localhost and loopback addresses only (a DNS-rebinding page is refused).",
            rich_help_panel=SERVER,
            show_default=False,
        ),
    ] = None,
    keep_alive: Annotated[
        str,
        typer.Option("--keep-alive", help="Unload a model after this long unused (30s, 5m, 1h; -1: never)."),
    ] = "-1",
    max_queue: Annotated[
        int, typer.Option("--max-queue", min=1, help="Requests waiting per model before 503.", rich_help_panel=SERVER)
    ] = 64,
    max_models: Annotated[
        int | None,
        typer.Option(
            "--max-models",
            min=1,
            help="Text models loaded at once; loading another unloads the least recently used idle one.",
            rich_help_panel=SERVER,
            show_default=False,
        ),
    ] = None,
    max_memory: Annotated[
        str | None,
        typer.Option(
            "--max-memory",
            metavar="SIZE",
            help="Memory the loaded models may take, as planned (weights + KV cache + overhead; 8G, 512M); "
            "past it the least recently used idle model is unloaded. Default: what is free at start, less 1 GiB.",
            rich_help_panel=SERVER,
            show_default=False,
        ),
    ] = None,
    max_connections: Annotated[
        int,
        typer.Option(
            "--max-connections",
            min=1,
            help="Connections and requests at once before 503.",
            rich_help_panel=SERVER,
        ),
    ] = 256,
    max_tokens: Annotated[
        int,
        typer.Option(
            "--max-tokens",
            "-n",
            min=1,
            help="The longest answer, in tokens: a request may ask for up to this many (max_tokens, num_predict; "
            "more is a 400 naming the field) and gets this many at most when it asks for none.",
            rich_help_panel=SERVER,
        ),
    ] = 2048,
    request_timeout: Annotated[
        float,
        typer.Option(
            "--request-timeout",
            min=0,
            help="Seconds a request may take, waiting for a slot included (0: no limit). An answer still "
            'going then ends with what it has (finish_reason / done_reason "length") and frees its slot; '
            "a request still waiting gets a 503.",
            rich_help_panel=SERVER,
        ),
    ] = 300.0,
    allow_pull: Annotated[
        bool,
        typer.Option("--allow-pull", help="Let clients name models that must be downloaded.", rich_help_panel=SERVER),
    ] = False,
    no_prompt_cache: Annotated[
        bool,
        typer.Option(
            "--no-prompt-cache",
            help="Evaluate every prompt whole: no reuse of the KV cells an earlier request with the same beginning "
            "left (slower for conversations; answers never depend on what came before).",
            rich_help_panel=SERVER,
        ),
    ] = False,
    no_ui: Annotated[
        bool,
        typer.Option(
            "--no-ui",
            help="No web page at / (the APIs only).",
            rich_help_panel=SERVER,
        ),
    ] = False,
    open_page: Annotated[
        bool,
        typer.Option(
            "--open",
            help="Open the web page in a browser once the server listens.",
            rich_help_panel=SERVER,
        ),
    ] = False,
    draft: o.DraftOpt = None,
    draft_tokens: o.DraftTokensOpt = None,
    kv_cache_size: o.KvCacheSizeOpt = None,
    no_kv_cache: o.NoKvCacheOpt = False,
    force: o.ForceOpt = False,
    mmproj: Annotated[
        Path | None,
        typer.Option(
            "--mmproj",
            help="The first -m model's projector (its mmproj GGUF): it then reads images (OpenAI image_url data "
            "URLs, Ollama's images).",
            rich_help_panel=o.IMAGES,
            show_default=False,
        ),
    ] = None,
    allow_image_urls: Annotated[
        bool,
        typer.Option(
            "--allow-image-urls",
            help="Fetch the http(s) image URLs of OpenAI requests (off: data URLs only). Only public addresses "
            "(never loopback, private or link-local ones), at most 3 redirects, 32 MB, --image-url-timeout.",
            rich_help_panel=o.IMAGES,
        ),
    ] = False,
    image_url_network: Annotated[
        list[str] | None,
        typer.Option(
            "--image-url-network",
            metavar="CIDR",
            help="A non-public network image URLs may also come from (repeatable; e.g. 10.0.0.0/8 for an "
            "image store on your network). Goes with --allow-image-urls.",
            rich_help_panel=o.IMAGES,
            show_default=False,
        ),
    ] = None,
    image_url_timeout: Annotated[
        float,
        typer.Option(
            "--image-url-timeout",
            min=0.1,
            help="Seconds the fetch of one image URL may take, redirects included.",
            rich_help_panel=o.IMAGES,
        ),
    ] = 10.0,
) -> None:
    """Serve the OpenAI API (/v1: chat completions, completions, embeddings, models), Ollama's (/api) and a web
    page at / (a chat that shows each token's probability and what else the model could have said).

    Examples:

      llmrun serve

      llmrun serve -m qwen2.5:0.5b --port 8000 --parallel 8

      llmrun serve --ollama    (Ollama's port: Open WebUI, Continue and the ollama libraries use it as Ollama)

      curl http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json'
      -d '{"model": "gemma3:270m", "messages": [{"role": "user", "content": "Hello"}]}'
    """
    from llmrun.server.state import ServerConfig

    key = _api_key(api_key, api_key_file)
    if api_key is not None:
        from llmrun.cli import render

        render.warn(f"--api-key shows in the process list (ps): pass the key with --api-key-file or ${KEY_ENV}")
    if no_ui and open_page:
        raise UsageError("--open opens the web page, and --no-ui turns it off", "drop one of them")
    if not is_loopback(host) and key is None and not no_auth:
        raise UsageError(
            f"--host {host} makes the server reachable from other machines, and it has no API key",
            f"set one (--api-key-file FILE or ${KEY_ENV}), or pass --no-auth to serve without one",
        )
    if not allow_pull:
        os.environ["HF_HUB_OFFLINE"] = "1"  # client-named models never download
    config = ServerConfig(
        models=tuple(model or ()),
        parallel=parallel,
        n_ctx=ctx,
        load_flags=o.load_values(
            None, threads, gpu_layers, kv_bits, rpc=rpc, rpc_allow_remote=rpc_allow_remote, flash_attn=flash_attn
        ),
        backend=backend,
        api_key=key,
        keep_alive=_duration(keep_alive),
        max_models=max_models,
        max_memory=parse_size(max_memory) if max_memory is not None else None,
        max_queue=max_queue,
        max_connections=max_connections,
        max_tokens=max_tokens,
        request_timeout=request_timeout or None,
        allow_pull=allow_pull,
        cors_origins=tuple(o.rstrip("/") for o in cors_origin or ()),
        allowed_hosts=tuple(allowed_host or ()) if allowed_host or is_loopback(host) else None,
        force=force,
        cache_prompts=not no_prompt_cache,
        template=o.template_choice(template),
        draft=o.draft_choice(draft, draft_tokens),
        kv_cache=o.kv_cache_choice(kv_cache_size, no_kv_cache),
        ui=not no_ui,
        mmproj=_projector(model, mmproj),
        image_urls=_image_urls(allow_image_urls, image_url_network or [], image_url_timeout),
    )
    if config.kv_cache[0]:
        from llmrun.cli import render

        render.show_warnings("llmrun.kv")
    port = port if port is not None else OLLAMA_PORT if ollama else DEFAULT_PORT
    _check_port(host, port, ollama)
    _run(config, host, port, warn_open=not is_loopback(host) and key is None, open_page=open_page)


def _projector(models: list[str] | None, mmproj: Path | None) -> tuple[str, Path] | None:
    """--mmproj: the first -m model's projector (it then reads images)."""
    if mmproj is None:
        return None
    if not models:
        raise UsageError("--mmproj goes with -m MODEL: it is that model's projector", "add -m MODEL")
    if not mmproj.is_file():
        raise UsageError(f"the projector {mmproj} does not exist", "give the model's mmproj GGUF file")
    return models[0], mmproj


def _image_urls(allowed: bool, networks: list[str], timeout: float) -> UrlPolicy | None:
    """--allow-image-urls: what the server may fetch (None: no URL at all)."""
    from llmrun.server.image_urls import UrlPolicy, parse_networks

    if networks and not allowed:
        raise UsageError("--image-url-network goes with --allow-image-urls", "add --allow-image-urls")
    if not allowed:
        return None
    try:
        return UrlPolicy(parse_networks(networks), timeout_s=timeout)
    except ValueError as exc:
        raise UsageError(f"--image-url-network: {exc}", "give a network as 10.0.0.0/8 or an address") from None


DEFAULT_PORT = 8080
OLLAMA_PORT = 11434


def _check_port(host: str, port: int, ollama: bool) -> None:
    """Refuse before loading anything when the address is taken (on Ollama's port: Ollama, likely)."""
    import errno
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror}", "check --host and --port") from None
            hint = (
                "stop Ollama (ollama serve, or its app) first, or pass --port"
                if port == OLLAMA_PORT
                else "pass another --port"
            )
            raise UsageError(f"port {port} on {host} is already in use", hint) from None


def _api_key(value: str | None, path: Path | None) -> str | None:
    if value is not None and path is not None:
        raise UsageError("--api-key and --api-key-file both given", "use one")
    if path is not None:
        try:
            value = path.expanduser().read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise UsageError(f"cannot read the key file {path}: {exc.strerror}", "check the path") from None
        if not value:
            raise UsageError(f"the key file {path} is empty", "put the key on its first line")
    value = value if value is not None else os.environ.get(KEY_ENV) or None
    if value is not None and (len(value) < 8 or any(c.isspace() for c in value)):
        raise UsageError("the API key must be at least 8 characters, without spaces", "e.g. openssl rand -hex 24")
    return value


def _duration(text: str) -> float | None:
    """'30s', '5m', '1h', '90' (seconds); '-1' or 'never': None."""
    value = text.strip().lower()
    if value in ("-1", "never", "inf"):
        return None
    units = {"s": 1, "m": 60, "h": 3600}
    number, unit = (value[:-1], units[value[-1]]) if value and value[-1] in units else (value, 1)
    try:
        seconds = float(number) * unit
    except ValueError:
        raise UsageError(f"--keep-alive {text!r} is not a duration", "e.g. 30s, 5m, 1h, or -1 for never") from None
    if seconds < 0:
        raise UsageError(f"--keep-alive {text!r} is negative", "-1 keeps models loaded")
    return seconds


def _run(config: ServerConfig, host: str, port: int, *, warn_open: bool, open_page: bool = False) -> None:
    from llmrun.cli import render
    from llmrun.server.run import run
    from llmrun.server.state import Served, ServerState

    state = ServerState(config)
    with render.status("Loading…"):
        served = state.load_at_start() if config.models else [state.get(_default_name(), operator=True)]
    for s in served:
        if not isinstance(s, Served):
            render.note(f"serving {s.name}: embeddings, {s.embedder.dimension} dimensions")
            continue
        if state.find(s.name) is None:
            render.note(f"{s.name}: unloaded at start to make room (--max-models, --max-memory); it loads when asked")
            continue
        if s.remote:
            where = ", ".join(e.url for e in s.scheduler.entry.plan.endpoints)
            render.note(f"serving {s.name}: a proxy to {where}, {config.parallel} in parallel")
            continue
        how = f"{config.parallel} in parallel" if s.scheduler.batching else f"one at a time ({s.scheduler.unbatched})"
        draft = s.scheduler.entry.plan.draft
        drafting = f", drafting: {draft.value} (up to {draft.tokens} tokens)" if draft.on else ""
        render.note(f"serving {s.name}: {s.n_ctx} tokens per request, {how}{drafting}")
    if warn_open:
        render.warn(f"serving on {host} without an API key (--no-auth): anyone who can reach it can use it")
    if "*" in config.cors_origins and config.api_key is None:
        render.warn("--cors-origin '*' without an API key: every web page you open can use this server")
    base = f"http://{_shown_host(host)}:{port}"
    render.note(f"listening on {base}/v1 (OpenAI) and {base}/api (Ollama) (Ctrl-C stops)")
    if config.ui:
        page = f"http://{_shown_host(_local_host(host))}:{port}/"
        render.note(f"the web page: {page}")
        if open_page:
            _open_when_listening(page, host, port)
    run(state, host, port)
    render.note("stopped")


def _default_name() -> str:
    from llmrun.models.registry import default_model_name, load_registry

    return default_model_name(load_registry())[0]


def _local_host(host: str) -> str:
    """Where a browser on this machine reaches a server bound to ``host`` (a wildcard bind: loopback)."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)


def _open_when_listening(page: str, host: str, port: int, timeout: float = 60.0) -> None:
    """The page in the user's browser once the port accepts connections (the models are loaded by then)."""
    import socket
    import threading
    import time
    import webbrowser

    def wait_and_open() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                socket.create_connection((_local_host(host), port), timeout=1).close()
            except OSError:
                time.sleep(0.1)
                continue
            if not webbrowser.open(page):
                from llmrun.cli import render

                render.note(f"no browser to open here: visit {page}")
            return

    threading.Thread(target=wait_and_open, name="llmrun open page", daemon=True).start()


def _shown_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
