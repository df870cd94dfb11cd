"""The OpenAI API on the wire, without a network: request bodies, streamed chunks, error bodies, URLs,
Retry-After, models.toml endpoint entries and OpenAI Batch lines."""

from __future__ import annotations

import json
import time
from email.utils import formatdate
from pathlib import Path

import pytest

from llmrun.api import batch as batchio
from llmrun.decoding.sampling import SamplingParams
from llmrun.engine.request import Request
from llmrun.errors import ConfigError, UsageError
from llmrun.models.endpoint import Endpoint, base_url
from llmrun.models.registry import parse_registry_text
from llmrun.prompt.template import Message, ToolCall
from llmrun.remote import wire
from llmrun.remote.client import retry_after
from llmrun.structured.formats import ANY_JSON, Format, from_schema
from llmrun.structured.tools import Tool, ToolUse


def test_a_prompt_is_a_conversation_with_every_setting_under_the_names_engines_read() -> None:
    params = SamplingParams(temperature=0.3, top_k=7, min_p=0.1, repeat_penalty=1.2, seed=5, max_tokens=9, stop=("x",))
    request = Request(prompt="Hi", params=params, system="Be brief.")
    data = wire.body(request, "m", extras=frozenset(wire.EXTRA_FIELDS))
    assert wire.route(request) == "/chat/completions"
    assert data["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert (data["model"], data["temperature"], data["seed"], data["max_tokens"], data["stop"]) == (
        "m",
        0.3,
        5,
        9,
        ["x"],
    )
    assert (data["top_k"], data["min_p"], data["repeat_penalty"], data["repetition_penalty"]) == (7, 0.1, 1.2, 1.2)
    assert data["stream"] is True and data["stream_options"] == {"include_usage": True}
    assert "presence_penalty" not in data  # zero: OpenAI's default, not sent


def test_settings_not_chosen_for_sending_stay_out_and_unlimited_length_sends_no_max_tokens() -> None:
    data = wire.body(Request(prompt="Hi", params=SamplingParams(max_tokens=-1)), "m", stream=False)
    assert not set(data) & {"top_k", "min_p", "repeat_penalty", "repetition_penalty", "max_tokens", "stream"}


def test_a_raw_prompt_goes_to_the_completions_api_as_plain_text() -> None:
    request = Request(prompt="Once upon", raw=True, system="S")
    assert wire.route(request) == "/completions"
    assert wire.body(request, "m")["prompt"] == "S\n\nOnce upon"


def test_messages_keep_their_system_prompt_tool_calls_and_formats() -> None:
    call = ToolCall("c1", "add", '{"a": 1}')
    messages = (
        Message("system", "own"),
        Message("user", "add"),
        Message("assistant", "", tool_calls=(call,)),
        Message("tool", "2", tool_call_id="c1"),
    )
    tools = ToolUse((Tool("add", "adds", '{"type": "object"}'),), mode="function", function="add")
    schema = from_schema({"type": "object"}, "thing")
    request = Request(messages=messages, system="ignored: the messages carry one", tools=tools, response_format=schema)
    data = wire.body(request, "m")
    assert [m["role"] for m in data["messages"]] == ["system", "user", "assistant", "tool"]
    assert data["messages"][2]["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 1}'}
    assert data["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert data["response_format"]["json_schema"] == {"name": "thing", "schema": {"type": "object"}, "strict": True}
    assert wire.body(Request(prompt="x", response_format=ANY_JSON), "m")["response_format"] == {"type": "json_object"}
    assert wire.body(Request(prompt="x", response_format=Format("gbnf", 'root ::= "a"')), "m")["grammar"]
    with pytest.raises(UsageError, match="Lark"):
        wire.body(Request(prompt="x", response_format=Format("lark", "start: 'a'")), "m")
    asked = wire.body(Request(prompt="x", logprobs=2), "m")
    assert asked["logprobs"] is True and asked["top_logprobs"] == 2
    assert wire.body(Request(prompt="x", raw=True, logprobs=3), "m")["logprobs"] == 3  # the completions API


def test_log_probabilities_come_back_in_either_apis_shape() -> None:
    chat = {
        "content": [
            {
                "token": " Par",
                "logprob": -0.1,
                "bytes": [32, 80, 97, 114],
                "top_logprobs": [
                    {"token": " Par", "logprob": -0.1},
                    {"token": " Lyon", "logprob": -2.5, "bytes": None},
                ],
            },
            {"token": "x", "logprob": "bad"},  # malformed: left out
        ]
    }
    [entry] = wire.token_logprobs(chat)
    assert (entry.piece, entry.logprob) == (b" Par", -0.1)
    assert [(c.piece, c.logprob) for c in entry.top] == [(b" Par", -0.1), (b" Lyon", -2.5)]
    legacy = {"tokens": [" a", " b"], "token_logprobs": [-0.5, -1.0], "top_logprobs": [{" a": -0.5, " c": -2.0}]}
    entries = wire.token_logprobs(legacy)
    assert [(e.piece, e.logprob) for e in entries] == [(b" a", -0.5), (b" b", -1.0)]
    assert [(c.piece, c.logprob) for c in entries[0].top] == [(b" a", -0.5), (b" c", -2.0)] and entries[1].top == ()
    assert wire.token_logprobs(None) == [] and wire.token_logprobs({"content": "x"}) == []
    assembly = wire.Assembly()
    token = assembly.chunk({"choices": [{"delta": {"content": " Par"}, "logprobs": chat}]})
    assert token is not None and token.logprob == -0.1 and len(token.top) == 2
    assembly.chunk({"choices": [{"delta": {}, "finish_reason": "stop"}]})
    result = assembly.result(Request(prompt="x", logprobs=2), 0.1, 0.2, 0.0)
    assert result.logprobs is not None and [e.piece for e in result.logprobs] == [b" Par"]
    assert assembly.result(Request(prompt="x"), 0.1, 0.2, 0.0).logprobs is None


def test_a_stream_becomes_tokens_and_one_result_with_the_endpoints_counts() -> None:
    assembly = wire.Assembly()
    chunks = [
        {"choices": [{"delta": {"role": "assistant"}}]},
        {"choices": [{"delta": {"reasoning_content": "hmm"}}]},
        {"choices": [{"delta": {"content": "Hel"}}]},
        {"choices": [{"delta": {"content": "lo"}, "finish_reason": "length"}]},
        {
            "choices": [],
            "usage": {"prompt_tokens": 12, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 4}},
        },
    ]
    tokens = [t for t in (assembly.chunk(c) for c in chunks) if t is not None]
    assert [(t.text, t.reasoning) for t in tokens] == [("", "hmm"), ("Hel", ""), ("lo", "")]
    result = assembly.result(Request(prompt="x", params=SamplingParams(temperature=0)), 1.0, 3.0, 0.5)
    assert (result.text, result.reasoning, result.finish_reason) == ("Hello", "hmm", "length")
    assert (result.prompt_tokens, result.generated_tokens, result.cached_tokens, result.seed) == (12, 3, 4, None)
    assert result.time_to_first_token_s == pytest.approx(0.5)
    assert result.generation_tokens_per_s == pytest.approx(1.0)  # 2 tokens after the first, in 2 s


def test_without_usage_the_chunks_are_counted_and_tool_call_fragments_are_joined() -> None:
    assembly = wire.Assembly()
    parts = [
        {"index": 0, "id": "call_9", "function": {"name": "add", "arguments": '{"a"'}},
        {"index": 0, "function": {"arguments": ": 1}"}},
    ]
    for part in parts:
        assembly.chunk({"choices": [{"delta": {"tool_calls": [part]}}]})
    assembly.chunk({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]})
    result = assembly.result(Request(messages=(Message("user", "x"),)), None, 1.0, 0.0)
    assert result.tool_calls == (ToolCall("call_9", "add", '{"a": 1}'),)
    assert (result.content, result.finish_reason, result.generated_tokens) == (None, "eos", 0)
    completion = wire.Assembly()
    for text in ("a", "b", "c"):
        completion.chunk({"choices": [{"text": text}]})
    assert completion.result(Request(prompt="x"), 0.0, 1.0, 0.0).generated_tokens == 3


def test_a_constrained_answer_is_valid_only_when_whole_json() -> None:
    def result(text: str, finish: str) -> bool | None:
        assembly = wire.Assembly()
        assembly.whole({"choices": [{"message": {"content": text}, "finish_reason": finish}]})
        return assembly.result(Request(prompt="x", response_format=ANY_JSON), 0.0, 0.0, 0.0).valid

    assert result('{"a": 1}', "stop") is True
    assert result('{"a": ', "length") is False
    assert result("not json", "stop") is False


def test_hostile_chunks_are_ignored_not_crashed_on() -> None:
    assembly = wire.Assembly()
    for chunk in [
        None,
        [],
        {"choices": "x"},
        {"choices": [None]},
        {"choices": [{"delta": {"content": 5}}]},
        {"usage": 3},
    ]:
        assert assembly.chunk(chunk) is None
    assert assembly.result(Request(prompt="x"), None, 0.0, 0.0).text == ""


def test_error_bodies_in_each_servers_shape() -> None:
    assert wire.error_message({"error": {"message": "bad key"}}, "?") == "bad key"
    assert (
        wire.error_message({"detail": [{"loc": ["body", "top_k"], "msg": "not allowed"}]}, "?") == "top_k: not allowed"
    )
    assert wire.error_message({"error": "plain"}, "?") == "plain"
    assert wire.error_message("<html>", "fallback") == "fallback"
    assert wire.served_models({"data": [{"id": "a"}, {"id": "b"}, "junk"]}) == ["a", "b"]
    assert wire.served_models({"models": [{"name": "llama3"}]}) == ["llama3"]


@pytest.mark.parametrize(
    ("given", "url"),
    [
        ("127.0.0.1:8080", "http://127.0.0.1:8080/v1"),
        ("http://gpu1:8000/v1/", "http://gpu1:8000/v1"),
        ("https://api.example.com/openai/v1", "https://api.example.com/openai/v1"),
    ],
)
def test_endpoint_urls_are_normalized(given: str, url: str) -> None:
    assert base_url(given) == url


@pytest.mark.parametrize("bad", ["", "ftp://host/v1", "http://", "http://user:secret@host/v1", "http://host:99999"])
def test_bad_endpoint_urls_are_refused_without_echoing_credentials(bad: str) -> None:
    with pytest.raises(UsageError) as caught:
        base_url(bad)
    assert "secret" not in str(caught.value)


def test_the_key_comes_from_its_variable_only(monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint = Endpoint("http://h:1/v1", key_env="MY_KEY")
    monkeypatch.delenv("MY_KEY", raising=False)
    assert endpoint.key is None
    monkeypatch.setenv("MY_KEY", "sk-1")
    assert endpoint.key == "sk-1" and "sk-1" not in repr(endpoint)
    assert endpoint.root == "http://h:1"


def test_retry_after_reads_seconds_and_dates() -> None:
    assert retry_after("3") == 3.0
    assert retry_after(None) is None and retry_after("soon") is None
    later = retry_after(formatdate(time.time() + 20, usegmt=True))
    assert later is not None and 15 < later <= 21


def test_models_toml_endpoint_entries(tmp_path: Path) -> None:
    text = """
[models.big]
endpoint = ["gpu1:8000", "http://gpu2:8000/v1"]
model = "Qwen/Qwen3-8B"
api_key_env = "GPU_KEY"
context = 32768
defaults = { temperature = 0.2 }
"""
    entry = parse_registry_text(text, tmp_path / "models.toml").models["big"]
    assert entry.remote and entry.endpoints == ("http://gpu1:8000/v1", "http://gpu2:8000/v1")
    assert (entry.served, entry.api_key_env, entry.context) == ("Qwen/Qwen3-8B", "GPU_KEY", 32768)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('endpoint = "gpu1:8000"\ngguf = { repo = "a/b" }', "no local files"),
        ('model = "x"', "goes with 'endpoint'"),
        ('endpoint = "ftp://x"', "not an http"),
        ('endpoint = "h:1"\napi_key_env = "sk-abc def"', "environment variable"),
        ("endpoint = []", "a URL or a list"),
    ],
)
def test_bad_endpoint_entries_name_the_key(tmp_path: Path, body: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        parse_registry_text(f"[models.big]\n{body}\n", tmp_path / "models.toml")


def test_openai_batch_lines_are_read_and_answered_in_their_shape() -> None:
    line = {"custom_id": "r-1", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "gpt-4o-mini"}}
    bad = [
        {"custom_id": "r-2", "method": "GET", "url": "/v1/chat/completions", "body": {}},
        {"custom_id": "r-3", "method": "POST", "url": "/v1/embeddings", "body": {}},
        {"custom_id": 4, "method": "POST", "url": "/v1/completions", "body": {}},
        {"custom_id": "r-5", "method": "POST", "url": "/v1/completions", "body": {}, "extra": 1},
    ]
    parsed = list(batchio.parse([json.dumps(line), *(json.dumps(b) for b in bad)]))
    item = parsed[0]
    assert isinstance(item, batchio.Item) and item.openai is not None and item.openai.chat
    assert item.id == "r-1" and item.output_id == "r-1"
    assert all(isinstance(p, batchio.LineError) for p in parsed[1:])
    out = batchio.openai_result("r-1", {"object": "chat.completion"})
    assert out["custom_id"] == "r-1" and out["error"] is None and out["response"]["status_code"] == 200
    assert out["id"].startswith("batch_req_") and out["response"]["body"] == {"object": "chat.completion"}


def test_resume_reads_custom_ids(tmp_path: Path) -> None:
    output = tmp_path / "out.jsonl"
    output.write_text(json.dumps(batchio.openai_result("a", {})) + "\n" + json.dumps({"id": 3}) + "\n")
    assert batchio.finished_ids(output) == {"a", "3"}
