"""The screenshots of the page at / in docs/images/, taken in headless Chromium from a running server.

    llmrun serve -m smollm2:135m &          # (nothing else running a model on this machine)
    python scripts/page-screenshots.py http://127.0.0.1:8080 [--key KEY]

Each view is driven as a person would drive it (type, send, hover, switch tabs), at temperature 0
so that the pictures are the same each time for the same model.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

from tests.support.browser import chromium  # noqa: E402

OUT = ROOT / "docs" / "images"


def testid(driver: Any, name: str) -> Any:
    return driver.find_element(By.CSS_SELECTOR, f"[data-testid={name}]")


def wait(driver: Any, script: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not driver.execute_script(script):
        if time.monotonic() > deadline:
            raise SystemExit(f"the page did not get there in {timeout:.0f} s: {script}")
        time.sleep(0.1)


def ask(driver: Any, text: str) -> None:
    testid(driver, "prompt").send_keys(text)
    testid(driver, "send").click()
    wait(driver, "return document.body.dataset.busy === 'yes'")
    wait(driver, "return document.body.dataset.busy === 'no'")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--key", default="")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    with chromium(width=1280, height=800) as driver:
        driver.get(args.url.rstrip("/") + "/")
        if args.key:
            wait(driver, "return document.getElementById('key-dialog').open")
            testid(driver, "api-key").send_keys(args.key)
            driver.find_element(By.ID, "key-use").click()
        wait(driver, "return document.querySelectorAll('[data-testid=model] option').length > 0")
        driver.execute_script(
            "const s = document.querySelector('[data-testid=settings-temperature]');"
            "s.value = 0; s.dispatchEvent(new Event('input'));"
        )
        ask(driver, "Write a Python function that adds two numbers, in a code block.")
        driver.save_screenshot(str(OUT / "page-chat.png"))

        testid(driver, "new-chat").click()
        testid(driver, "show-probs").click()
        ask(driver, "Name three colours.")
        token = driver.find_elements(By.CSS_SELECTOR, "[data-testid=answer] [data-testid=token]")[3]
        ActionChains(driver).move_to_element(token).perform()
        wait(driver, "return !document.querySelector('[data-testid=alternatives]').hidden")
        driver.save_screenshot(str(OUT / "page-probabilities.png"))

        testid(driver, "tab-inside").click()
        testid(driver, "look-run").click()
        wait(driver, "return / tokens · capture/.test(document.querySelector('[data-testid=look-status]').textContent)")
        driver.save_screenshot(str(OUT / "page-inside.png"))
    print(f"page-chat.png, page-probabilities.png, page-inside.png → {OUT}")


if __name__ == "__main__":
    main()
