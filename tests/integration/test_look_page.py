"""``llmrun look --html`` in a real browser (headless Chromium): the page works offline and shows the
captured numbers — hover a token, pick a layer and a head, read the lens grid."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import chromium
from tests.support.helpers import invoke

pytestmark = pytest.mark.slow

PRONOUN = "The animal didn't cross the street because it was too tired"


def write_page(tmp_path: Path, prompt: str) -> tuple[Path, dict[str, Any]]:
    page = tmp_path / "look.html"
    code, out, err = invoke(["look", "--raw", "--html", str(page), "--json", prompt])
    assert code == 0, err
    return page, json.loads(out)


def chip_weights(browser: Any) -> list[str]:
    return [el.text for el in browser.find_elements("css selector", ".tok .w")]


def mean_row(report: dict[str, Any], layer: int, query: int, heads: list[int]) -> list[float]:
    rows = [report["attention"][layer][h][query] for h in heads]
    return [sum(r[k] for r in rows) / len(rows) for k in range(query + 1)]


def test_the_page_shows_the_captured_attention_and_lens(gemma: Path, tmp_path: Path) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.support.ui import Select

    page, report = write_page(tmp_path, PRONOUN)
    n = len(report["tokens"])
    with chromium() as browser:
        browser.get(page.as_uri())
        assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
        chips = browser.find_elements("css selector", ".tok")
        assert len(chips) == n
        ActionChains(browser).move_to_element(chips[10]).perform()  # ' it'
        want = mean_row(report, 17, 10, [0, 1, 2, 3])
        assert chip_weights(browser)[:11] == [f"{w:.2f}" for w in want]
        assert chip_weights(browser)[11:] == [""] * (n - 11)  # later tokens are not read
        chips[10].click()  # keep ' it' while the pointer moves on
        Select(browser.find_element("id", "layer")).select_by_value("7")
        Select(browser.find_element("id", "head")).select_by_value("0")
        assert chip_weights(browser)[:11] == [f"{w:.2f}" for w in mean_row(report, 7, 10, [0])]
        chosen = browser.find_elements("css selector", "#heads td.chosen")
        assert len(chosen) == 1 and "layer 7, head 0" in chosen[0].get_attribute("title")
        cell = browser.find_elements("css selector", "#heads tr")[1 + 4].find_elements("css selector", "td")[2]
        cell.click()  # layer 4, head 2 from the overview
        assert Select(browser.find_element("id", "layer")).first_selected_option.text == "4"
        assert Select(browser.find_element("id", "head")).first_selected_option.text == "2"
        browser.find_element("id", "skip").click()  # without the first token, rescaled
        shown = [float(w) for w in chip_weights(browser)[:11]]
        assert shown[0] == 0 and sum(shown) == pytest.approx(1, abs=0.06)
        rows = browser.find_elements("css selector", "#lens tr")
        assert len(rows) == 1 + 18
        last = rows[-1].find_elements("css selector", "td")
        assert len(last) == n
        assert last[-1].text == report["lens"][-1][-1]["text"].replace(" ", "\u2423")
        assert "%" in last[-1].get_attribute("title")
        errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == []
        shot = tmp_path / "look.png"
        assert browser.save_screenshot(str(shot))
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000


def test_a_hostile_prompt_stays_text(gemma: Path, tmp_path: Path) -> None:
    hostile = '</script><img src=x onerror="document.title=\'owned\'"><script>document.title="owned"</script>'
    page, report = write_page(tmp_path, hostile)
    with chromium() as browser:
        browser.get(page.as_uri())
        assert browser.title.startswith("llmrun look") and "owned" not in browser.title
        assert browser.find_elements("css selector", "#tokens img") == []
        shown = "".join(el.text.split("\n")[0] for el in browser.find_elements("css selector", ".tok"))
        assert "onerror" in shown  # the markup is shown as the tokens it is
        assert len(browser.find_elements("css selector", ".tok")) == len(report["tokens"])
