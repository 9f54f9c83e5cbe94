"""Headless Chromium (Debian's chromium and chromedriver) driven by selenium."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from tests.ports import free_port  # noqa: F401 (re-exported)

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--window-size=1280,1000")


@contextmanager
def chromium(profile: Path) -> Iterator[webdriver.Chrome]:
    """A headless Chromium with a fresh profile in ``profile``; quits at the end."""
    chromium_path = shutil.which("chromium")
    driver_path = shutil.which("chromedriver")
    assert chromium_path and driver_path, "make test installs chromium and chromium-driver"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium_path
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    try:
        yield driver
    finally:
        driver.quit()




def screenshot(driver: webdriver.Chrome, path: Path) -> None:
    driver.save_screenshot(str(path))
    print(f"screenshot: {path}")
