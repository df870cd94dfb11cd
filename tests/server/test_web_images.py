"""Images on the page at ``/``, in real headless Chromium against a real ``llmrun serve`` of the packaged Gemma
with the tests' random-weight projector: an attached image reaches the model as the API's ``image_url`` would
(the page's answer is the openai SDK's for the same bytes), stays in the conversation across a reload, and an
image the server does not read (WebP) is converted by the page rather than refused."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.support import imagefiles, projector, serving
from tests.support.browser import Page, chromium, opened

pytestmark = pytest.mark.slow
PROMPT = "Describe the picture."


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("page-images")
    return projector.write(folder / "mmproj.gguf"), imagefiles.png(folder / "a.png", 64, 48, seed=1)


@pytest.fixture(scope="module")
def server(gemma_cache: Path, files: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    env = serving.hermetic_env(tmp_path_factory.mktemp("serve"))
    args = ["-m", str(gemma_cache), "--mmproj", str(files[0]), "--template", "gemma", "--ctx", "1024"]
    # every prompt evaluated whole: the page's request and the API's, compared below, in the same shape (a
    # prompt partly from a slot's cache rounds near-ties otherwise on some CPUs' kernels)
    with serving.running([*args, "--no-prompt-cache"], env) as (url, _):
        yield url


@pytest.fixture(scope="module")
def page(server: str) -> Iterator[Page]:
    with chromium(width=1400, height=1000) as driver:
        yield opened(driver, server, max_tokens=8)


def api_answer(server: str, data_url: str) -> tuple[str, int]:
    client = openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0)
    content = [{"type": "image_url", "image_url": {"url": data_url}}, {"type": "text", "text": PROMPT}]
    answer = client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=[{"role": "user", "content": content}],  # type: ignore[list-item,misc]
        temperature=0,
        max_tokens=8,
    )
    assert answer.usage is not None
    return answer.choices[0].message.content or "", answer.usage.prompt_tokens


def soft_breaks(text: str) -> str:
    """What a rendered Markdown paragraph's text is: a single newline is a soft break (a space), blank lines
    part paragraphs (one line break in the rendered text)."""
    import re

    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text.strip()) if p.strip()]
    return "\n".join(re.sub(r"\s*\n\s*", " ", p) for p in paragraphs)


def test_an_attached_image_is_read_as_the_api_reads_it(server: str, page: Page, files: tuple[Path, Path]) -> None:
    image = files[1]
    page.until(lambda: "off" not in (page.find("attach").find_element("xpath", "..").get_attribute("class") or ""),
               "the attach button on (the model reads images)")  # fmt: skip
    page.find("attach").send_keys(str(image))
    page.until(lambda: page.all("[data-testid=attached-image]"), "the attached image")
    page.find("unattach").click()
    assert page.all("[data-testid=attached-image]") == []
    page.find("attach").send_keys(str(image))
    page.until(lambda: page.all("[data-testid=attached-image]"), "the attached image again")
    screenshots = os.environ.get("LLMRUN_SCREENSHOTS")  # to look at: the composer, then the answer
    if screenshots:
        page.driver.save_screenshot(str(Path(screenshots) / "page-attached.png"))
    page.send(PROMPT)
    page.finished()
    sent = page.all("[data-testid=message-image]")
    data_url = f"data:image/png;base64,{base64.b64encode(image.read_bytes()).decode()}"
    assert len(sent) == 1 and sent[0].get_attribute("src") == data_url  # the file's own bytes
    assert page.all("[data-testid=attached-image]") == []  # attached to that message only
    text, prompt_tokens = api_answer(server, data_url)
    kept = page.driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "import('/ui/store.js').then(s => s.conversations()).then(all => done(all[0].messages.at(-1).content));"
    )
    assert kept == text and text.strip()  # the answer the page got is the API's
    # and it shows as Markdown renders it: paragraphs on lines of their own, a single newline a space
    shown = page.find("answer").text.strip()
    assert shown == soft_breaks(text)
    assert f"prompt {prompt_tokens}" in page.find("answer-stats").text
    if screenshots:
        page.driver.save_screenshot(str(Path(screenshots) / "page-image.png"))


def test_the_image_stays_in_the_conversation_after_a_reload(page: Page) -> None:
    before = page.all("[data-testid=message-image]")[0].get_attribute("src")
    page.driver.refresh()
    page.until(lambda: page.all("[data-testid=message-image]"), "the kept image")
    assert page.all("[data-testid=message-image]")[0].get_attribute("src") == before


def test_a_webp_is_converted_and_a_non_image_refused(page: Page, server: str, tmp_path: Path) -> None:
    page.new_chat()
    page.driver.execute_async_script(
        """const done = arguments[arguments.length - 1];
        const canvas = document.createElement('canvas'); canvas.width = 80; canvas.height = 60;
        const g = canvas.getContext('2d'); g.fillStyle = '#3a7'; g.fillRect(0, 0, 80, 60);
        canvas.toBlob((blob) => {
          const data = new DataTransfer();
          data.items.add(new File([blob], 'green.webp', { type: 'image/webp' }));
          const input = document.getElementById('attach');
          input.files = data.files;
          input.dispatchEvent(new Event('change'));
          done();
        }, 'image/webp');"""
    )
    attached = page.until(lambda: page.all("[data-testid=attached-image]"), "the converted image")
    assert attached[0].get_attribute("src").startswith("data:image/jpeg;base64,")
    page.send(PROMPT)
    page.finished()
    assert page.find("answer").text.strip() and not page.all(".msg .error")
    fake = tmp_path / "notes.png"
    fake.write_text("not an image")
    page.find("attach").send_keys(str(fake))
    page.until(lambda: "notes.png is not an image" in page.find("status").text, "the refusal")
    assert page.all("[data-testid=attached-image]") == []


def test_the_inside_view_says_it_reads_the_text(page: Page, server: str) -> None:
    page.find("tab-inside").click()
    page.find("look-run").click()
    page.until(lambda: "the views do not capture images" in page.find("look-status").text, "the views, text only")
    page.find("tab-chat").click()
    png = base64.b64encode(imagefiles.png_bytes(8, 8)).decode()
    part = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}}
    refused = httpx.post(
        server + "/llmrun/look",
        json={"messages": [{"role": "user", "content": [part, {"type": "text", "text": "Hi"}]}]},
        timeout=60,
    )
    assert refused.status_code == 400 and "without its images" in refused.json()["error"]["message"]
