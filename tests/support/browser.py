"""Headless Chromium from Debian's packages (``chromium``, ``chromium-driver``), driven by Selenium.

Nothing downloads a browser: a machine without the packages fails the browser tests with the line
that installs them (``.ci/run`` installs them where they are missing)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

INSTALL = "apt-get install chromium chromium-driver"


def _found(*names: str) -> str | None:
    return next((path for name in names if (path := shutil.which(name))), None)


@contextmanager
def chromium(width: int = 1400, height: int = 1600, extra: tuple[str, ...] = ()) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver = _found("chromium", "chromium-browser"), _found("chromedriver")
    if browser is None or driver is None:
        pytest.fail(f"the page tests need Debian's headless Chromium and its driver: {INSTALL}")
    options = webdriver.ChromeOptions()
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
        *extra,
    ):
        options.add_argument(argument)
    options.binary_location = browser
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    session = webdriver.Chrome(service=Service(driver), options=options)
    try:
        yield session
    finally:
        session.quit()


def until(check: Callable[[], Any], what: str, timeout: float = 60, detail: Callable[[], str] = str) -> Any:
    """``check()``'s first true value, polled; an AssertionError naming ``what`` when time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.1)
    raise AssertionError(f"the page did not show {what} within {timeout:.0f} s{detail()}")


@dataclass
class Page:
    url: str
    driver: Any

    def find(self, testid: str) -> Any:
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.CSS_SELECTOR, f"[data-testid={testid}]")

    def all(self, selector: str) -> list[Any]:
        from selenium.webdriver.common.by import By

        return list(self.driver.find_elements(By.CSS_SELECTOR, selector))

    def until(self, check: Callable[[], Any], what: str, timeout: float = 60) -> Any:
        return until(check, what, timeout, lambda: f"; its console: {self.console()}")

    def console(self) -> list[str]:
        return [entry["message"] for entry in self.driver.get_log("browser")]

    def setting(self, name: str, value: float) -> None:
        self.driver.execute_script(
            "const s = arguments[0]; s.value = arguments[1]; s.dispatchEvent(new Event('input'));",
            self.find(f"settings-{name}"),
            value,
        )

    def probabilities(self, on: bool) -> None:
        box = self.find("show-probs")
        if box.is_selected() != on:
            box.click()

    def new_chat(self) -> None:
        self.find("new-chat").click()

    def busy(self) -> str:
        return str(self.driver.execute_script("return document.body.dataset.busy"))

    def send(self, text: str) -> None:
        prompt = self.find("prompt")
        prompt.clear()
        prompt.send_keys(text)
        self.find("send").click()
        self.until(lambda: self.busy() == "yes", "an answer starting")

    def finished(self, timeout: float = 120) -> None:
        self.until(lambda: self.busy() == "no", "the end of the answer", timeout)

    def tokens(self) -> list[tuple[str, float]]:
        return self.driver.execute_script(  # type: ignore[no-any-return]
            "return [...document.querySelectorAll('[data-testid=answer] [data-testid=token]')]"
            ".map(s => [s.textContent, Number(s.dataset.p)]);"
        )

    def hover(self, element: Any) -> list[tuple[str, float]]:
        from selenium.webdriver.common.action_chains import ActionChains

        ActionChains(self.driver).move_to_element(element).perform()
        self.until(lambda: self.find("alternatives").is_displayed(), "the alternatives")
        items = self.all("[data-testid=alternatives] [data-testid=alternative]")
        return [(li.get_attribute("data-token"), float(li.get_attribute("data-p"))) for li in items]


def opened(driver: Any, url: str, *, key: str | None = None, max_tokens: int) -> Page:
    """The page at ``url`` in ``driver``, with its models listed (the key given when it asks for one),
    greedy, and answers of at most ``max_tokens``."""
    driver.get(url + "/")
    page = Page(url, driver)
    if key is not None:
        field = page.until(lambda: page.find("api-key").is_displayed() and page.find("api-key"), "the key prompt")
        field.send_keys(key)
        driver.find_element("id", "key-use").click()
    page.until(lambda: page.all("[data-testid=model] option"), "the model picker filled")
    page.setting("temperature", 0)
    limit = page.find("settings-max_tokens")
    limit.clear()
    limit.send_keys(str(max_tokens))
    return page
