"""The page at ``/`` of ``llmrun serve``, in real headless Chromium (Debian's ``chromium`` and
``chromium-driver``, driven by Selenium) against a real server process on 127.0.0.1.

One server for the module: SmolLM2-135M-Instruct under a tagless name from the user's models.toml,
behind an API key, so the page must ask for the key; one browser for the module. What the page
shows is compared with what the API answers to the same request through the official ``openai``
SDK; the tagless name is also checked through the ``ollama`` library the way Open WebUI uses it.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import serving
from tests.support.agents import SMOLLM_PACKAGE
from tests.support.browser import Page, chromium, opened, until

pytestmark = pytest.mark.slow

KEY = "page-key-0123456789"
NAME = "chat"  # a name without a tag, as a models.toml entry gives it
HOSTILE = 'Repeat exactly, with nothing else: <img src=x onerror="window.pwned=1">'


@pytest.fixture(scope="module")
def server(smollm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    home = tmp_path_factory.mktemp("page")
    env = serving.hermetic_env(home)
    config = Path(env["LLMRUN_CONFIG_DIR"])
    config.mkdir(parents=True)
    (config / "models.toml").write_text(f"[models.{NAME}]\n{SMOLLM_PACKAGE}\n")
    # every prompt evaluated whole: the page's requests and the API's, compared below, in the same shape (a
    # prompt partly from a slot's cache rounds near-ties the other way on some CPUs' kernels)
    with serving.running(["-m", NAME, "--ctx", "2048", "--api-key", KEY, "--no-prompt-cache"], env) as (url, _):
        yield url


@pytest.fixture(scope="module")
def page(server: str) -> Iterator[Page]:
    with chromium(width=1400, height=1000) as driver:
        yield opened(driver, server, key=KEY, max_tokens=48)


def api_chat(server: str, messages: list[Any], **fields: Any) -> Any:
    from openai import OpenAI

    client = OpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0, timeout=120)
    return client.chat.completions.create(
        model=NAME, messages=messages, temperature=0, max_tokens=48, logprobs=True, top_logprobs=20, **fields
    )


def test_the_page_asks_for_the_key_and_lists_the_models(page: Page) -> None:
    assert [o.get_attribute("value") for o in page.all("[data-testid=model] option")] == [NAME]
    # the key is kept in the tab's session only, never in localStorage
    stored = page.driver.execute_script("return [sessionStorage.getItem('llmrun.key'), JSON.stringify(localStorage)]")
    assert stored[0] == KEY and KEY not in stored[1]


def test_a_model_that_reads_no_images_turns_the_attach_button_off(page: Page) -> None:
    label = page.find("attach").find_element("xpath", "..")
    page.until(lambda: "off" in (label.get_attribute("class") or ""), "the attach button off")
    assert "does not read images" in (label.get_attribute("title") or "") and not page.find("attach").is_enabled()


def test_assets_come_from_this_server_under_a_strict_policy(server: str, page: Page) -> None:
    answer = httpx.get(server + "/")
    policy = answer.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy and "connect-src 'self'" in policy
    assert answer.headers["x-content-type-options"] == "nosniff"
    loaded = page.driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert loaded and all(name.startswith(server + "/") for name in loaded), loaded
    assert httpx.get(server + "/ui/..%2F..%2Fetc%2Fpasswd").status_code == 404
    assert httpx.get(server + "/ui/web.py").status_code == 404  # only the page's own files
    assert httpx.get(server + "/v1/models").status_code == 401  # the data still needs the key


def test_the_streamed_answer_is_the_apis_greedy_answer_with_its_probabilities(server: str, page: Page) -> None:
    page.new_chat()
    page.probabilities(True)
    page.send("Name three colours.")
    page.finished()
    shown = page.tokens()
    expected = api_chat(server, [{"role": "user", "content": "Name three colours."}])
    content = expected.choices[0].logprobs.content
    assert "".join(t for t, _ in shown) == expected.choices[0].message.content
    assert [t for t, _ in shown] == [entry.token for entry in content]
    assert [p for _, p in shown] == pytest.approx([math.exp(e.logprob) for e in content], abs=2e-6)
    stats = page.find("answer-stats").text
    assert f"{len(content)} tokens" in stats and "tokens/s" in stats


def test_hovering_a_token_shows_the_apis_top_logprobs(server: str, page: Page) -> None:
    spans = page.all("[data-testid=answer] [data-testid=token]")
    expected = api_chat(server, [{"role": "user", "content": "Name three colours."}]).choices[0].logprobs.content
    for index in (1, 4):
        shown = page.hover(spans[index])
        wanted = [(alt.token, math.exp(alt.logprob)) for alt in expected[index].top_logprobs]
        assert [t for t, _ in shown] == [t for t, _ in wanted]
        assert [p for _, p in shown] == pytest.approx([p for _, p in wanted], abs=2e-6)


@pytest.mark.parametrize(
    "settings",
    [
        {"temperature": 0.7, "top_k": 5, "top_p": 0.9, "min_p": 0.05},
        {"temperature": 1.5, "top_k": 0, "top_p": 1, "min_p": 0.1},
        {"temperature": 0, "top_k": 40, "top_p": 0.95, "min_p": 0.05},  # the greedy settings the page keeps
    ],
)
def test_the_next_token_panel_reshapes_as_llamacpps_chain(page: Page, settings: dict[str, float]) -> None:
    import numpy as np

    from llmrun.decoding.sampling import REMOVED_BY, SamplingParams, sampling_stages

    span = page.all("[data-testid=answer] [data-testid=token]")[1]
    candidates = page.hover(span)
    for name, value in settings.items():
        page.setting(name, value)
    rows = [
        (r.get_attribute("data-token"), float(r.get_attribute("data-after")), r.get_attribute("data-cut"))
        for r in page.all("[data-testid=next-token] [data-testid=next-row]")
    ]
    assert [t for t, _, _ in rows] == [t for t, _ in candidates]
    logits = np.log([p for _, p in candidates])  # the reported top few, as the whole distribution
    top_k = int(settings["top_k"])
    params = SamplingParams(
        temperature=settings["temperature"], top_k=top_k, top_p=settings["top_p"], min_p=settings["min_p"]
    )
    stages = sampling_stages(logits, params)
    assert [after for _, after, _ in rows] == pytest.approx(list(stages.final), abs=2e-6)
    if settings["temperature"] > 0:
        assert [cut for _, _, cut in rows] == [REMOVED_BY[code] for code in stages.removed_by]
    else:  # greedy: the page names the filter that would have cut each one first, or temperature 0
        assert [cut == "" for _, _, cut in rows] == [True] + [False] * (len(rows) - 1)


def test_clicking_an_alternative_continues_from_it(server: str, page: Page) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    before = page.tokens()
    index = 2
    page.hover(page.all("[data-testid=answer] [data-testid=token]")[index])
    alternative = page.all("[data-testid=alternatives] [data-testid=alternative]")[1]
    picked = alternative.get_attribute("data-token")
    assert picked != before[index][0]
    ActionChains(page.driver).move_to_element(alternative).click().perform()
    page.until(lambda: page.busy() == "yes", "the continuation")
    page.finished()
    after = "".join(t for t, _ in page.tokens())
    prefix = "".join(t for t, _ in before[:index]) + picked
    assert after.startswith(prefix) and after != "".join(t for t, _ in before)
    continued = api_chat(
        server,
        [{"role": "user", "content": "Name three colours."}, {"role": "assistant", "content": prefix}],
        extra_body={"continue_final_message": True},
    )
    assert after == prefix + continued.choices[0].message.content


def test_stop_ends_the_answer_mid_stream_and_the_server_goes_on(server: str, page: Page) -> None:
    page.new_chat()
    field = page.find("settings-max_tokens")
    field.clear()
    field.send_keys("1000")
    try:
        page.send("Write a long story about a lighthouse keeper and a storm.")
        page.until(lambda: len(page.tokens()) >= 5, "the first tokens")
        page.find("stop").click()
        page.finished(timeout=10)
    finally:
        field.clear()
        field.send_keys("48")
    count = len(page.tokens())
    time.sleep(1)
    assert len(page.tokens()) == count < 1000  # nothing more arrives
    assert "stopped" in page.find("answer-stats").text
    assert page.find("send").is_displayed() and not page.find("stop").is_displayed()
    assert api_chat(server, [{"role": "user", "content": "Hi"}]).choices[0].message.content


def test_a_hostile_answer_does_not_execute(page: Page) -> None:
    page.new_chat()
    page.probabilities(False)  # Markdown: the path that makes HTML
    page.send(HOSTILE)
    page.finished()
    kept = page.driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "import('/ui/store.js').then(s => s.conversations()).then(all => done(all[0].messages.at(-1).content));"
    )
    assert 'onerror="window.pwned=1"' in kept  # the model did answer with the markup
    html = page.find("answer").get_attribute("innerHTML")
    assert "onerror" not in html and "<script" not in html
    assert page.driver.execute_script("return window.pwned") is None
    # a stored answer with a script, a handler and a javascript: link, as an imported conversation would be
    page.driver.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        import('/ui/store.js').then(store => store.save({
          id: 'hostile', title: 'hostile', model: arguments[0], updated: Date.now() + 1e6,
          messages: [{role: 'user', content: 'x'}, {role: 'assistant', tokens: [], reasoning: '',
            content: '<script>window.pwned=2</script>\\n\\n<img src=x onerror="window.pwned=3">\\n\\n'
              + '[go](javascript:window.pwned=4)'}],
        })).then(done);
        """,
        NAME,
    )
    page.driver.refresh()
    page.until(lambda: page.all("[data-testid=answer]"), "the stored answer")
    attributes = page.driver.execute_script(
        "const answer = document.querySelector('[data-testid=answer]');"
        "return [...answer.querySelectorAll('*')]"
        ".flatMap(e => [e.tagName, ...[...e.attributes].map(a => a.name + '=' + a.value)]);"
    )
    assert "IMG" in attributes and "A" in attributes  # the markup was rendered, less what could run
    assert "SCRIPT" not in attributes
    assert not [a for a in attributes if a.startswith("on") or "javascript:" in a]
    for link in page.all("[data-testid=answer] a"):
        link.click()
    assert page.driver.execute_script("return window.pwned") is None


def test_reload_keeps_the_conversations(page: Page) -> None:
    before = [li.text for li in page.all("[data-testid=conversations] li")]
    assert len(before) >= 3
    page.all("[data-testid=conversations] li")[-1].click()  # the oldest: the colours
    page.probabilities(True)
    shown = page.tokens()
    page.driver.refresh()
    page.until(lambda: len(page.all("[data-testid=conversations] li")) == len(before), "the kept conversations")
    assert [li.text for li in page.all("[data-testid=conversations] li")] == before
    page.all("[data-testid=conversations] li")[-1].click()
    assert page.tokens() == shown and shown


def test_the_inside_view_looks_at_the_last_prompt(server: str, page: Page) -> None:
    page.find("tab-inside").click()
    page.find("look-run").click()
    status = page.until(lambda: " tokens · capture" in (text := page.find("look-status").text) and text, "the views")
    look = httpx.post(
        server + "/llmrun/look",
        json={"model": NAME, "messages": [{"role": "user", "content": "Name three colours."}]},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=120,
    ).json()
    assert status.startswith(f"{len(look['tokens'])} tokens")
    chips = page.driver.execute_script("return [...document.querySelectorAll('#look-root .tok')].length")
    assert chips >= len(look["tokens"])
    assert not page.find("prompt").is_displayed()  # the chat is hidden behind the other tab
    page.find("tab-chat").click()


def test_edit_and_resend_then_regenerate(server: str, page: Page) -> None:
    page.new_chat()
    page.probabilities(True)
    page.send("Name three colours.")
    page.finished()
    page.find("edit").click()
    area = page.find("edit-text")
    area.clear()
    area.send_keys("What is 2+2?")
    page.find("edit-send").click()
    page.until(lambda: page.busy() == "yes", "the resent question")
    page.finished()
    wanted = api_chat(server, [{"role": "user", "content": "What is 2+2?"}]).choices[0].message.content
    assert "".join(t for t, _ in page.tokens()) == wanted
    assert len(page.all("#messages .msg")) == 2  # the old answer is replaced, not kept below
    page.find("regenerate").click()
    page.until(lambda: page.busy() == "yes", "the regenerated answer")
    page.finished()
    assert "".join(t for t, _ in page.tokens()) == wanted  # greedy: the same again
    assert len(page.all("#messages .msg")) == 2


def test_export_then_import_restores_every_conversation(page: Page, tmp_path: Path) -> None:
    page.driver.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(tmp_path)})
    before = [li.text for li in page.all("[data-testid=conversations] li")]
    page.find("export").click()
    exported = page.until(lambda: [f for f in tmp_path.glob("llmrun-conversations-*.json")], "the exported file")[0]
    page.until(lambda: exported.stat().st_size > 0 and json.loads(exported.read_text()), "a whole export")
    data = json.loads(exported.read_text())
    assert len(data["conversations"]) == len(before)
    page.driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "import('/ui/store.js').then(async s => { for (const c of await s.conversations()) await s.remove(c.id); })"
        ".then(done);"
    )
    page.driver.refresh()
    page.until(lambda: page.all("[data-testid=model] option"), "the page again")
    assert page.all("[data-testid=conversations] li") == []
    bad = tmp_path / "notes.json"
    bad.write_text('{"notes": []}')
    page.find("import").send_keys(str(bad))
    page.until(lambda: "cannot import notes.json" in page.find("status").text, "the refusal")
    page.find("import").send_keys(str(exported))
    page.until(lambda: len(page.all("[data-testid=conversations] li")) == len(before), "the imported conversations")
    assert [li.text for li in page.all("[data-testid=conversations] li")] == before


def test_a_tagless_name_serves_ollama_clients_that_add_latest(server: str) -> None:
    import ollama

    client = ollama.Client(host=server, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)
    assert client.show(NAME + ":latest").template
    assert NAME in [m.model for m in client.list().models]
    hi = [{"role": "user", "content": "Hi"}]
    answer = client.chat(NAME + ":latest", messages=hi, options={"temperature": 0, "num_predict": 8})
    assert answer.message.content and answer.model == NAME
    with pytest.raises(ollama.ResponseError) as info:
        client.chat("other:latest", messages=[{"role": "user", "content": "Hi"}])
    assert info.value.status_code == 404


def test_no_ui_turns_the_page_off_and_open_opens_it(smollm: Path, tmp_path: Path) -> None:
    env = serving.hermetic_env(tmp_path)
    clash = subprocess.run(
        [sys.executable, "-m", "llmrun", "serve", "-m", str(smollm), "--no-ui", "--open"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert clash.returncode == 2 and len(clash.stderr.strip().splitlines()) == 1 and "--no-ui" in clash.stderr
    with serving.running(["-m", str(smollm), "--no-ui"], env) as (url, _):
        assert httpx.get(url + "/").status_code == 404
        assert httpx.get(url + "/ui/app.js").status_code == 404
        assert httpx.get(url + "/v1/models").status_code == 200
    opened = tmp_path / "opened"
    opener = tmp_path / "opener"
    opener.write_text(f'#!/bin/sh\necho "$1" > {opened}\n')
    opener.chmod(0o755)
    with serving.running(["-m", str(smollm), "--open"], {**env, "BROWSER": str(opener)}) as (url, _):
        page = until(lambda: opened.is_file() and opened.read_text().strip(), "the browser opened")
        assert page == url + "/"
        assert "<title>llmrun</title>" in httpx.get(page).text
