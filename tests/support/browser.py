"""Headless Chromium from Debian's packages (``chromium``, ``chromium-driver``), driven by Selenium.

Nothing downloads a browser: a machine without the packages fails the browser tests with the line
that installs them (``.ci/run`` installs them where they are missing)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

INSTALL = "apt-get install chromium chromium-driver"


def _found(*names: str) -> str | None:
    return next((path for name in names if (path := shutil.which(name))), None)


@contextmanager
def chromium(width: int = 1400, height: int = 1600) -> Iterator[Any]:
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
    ):
        options.add_argument(argument)
    options.binary_location = browser
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    session = webdriver.Chrome(service=Service(driver), options=options)
    try:
        yield session
    finally:
        session.quit()
