"""The browser rig: Debian's Chromium and chromedriver driven by selenium, headless.

The browser comes from Debian's packages (``apt-get install chromium
chromium-driver``), installed here by the session when missing (as root);
selenium is given both paths, so it never downloads a browser or a driver.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

PACKAGES = ("chromium", "chromium-driver")


def _find() -> tuple[str, str] | None:
    browser = shutil.which("chromium")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def install_chromium() -> tuple[str, str]:
    """Paths of chromium and chromedriver, installed from Debian's packages when missing."""
    found = _find()
    if found:
        return found
    assert os.geteuid() == 0, "chromium is missing: apt-get install chromium chromium-driver"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(
        ["apt-get", "update", "-qq"], check=True, env=env, timeout=600, capture_output=True
    )
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES],
        check=True,
        env=env,
        timeout=1200,
        capture_output=True,
    )
    found = _find()
    assert found, "apt-get install chromium chromium-driver did not provide both binaries"
    return found


@pytest.fixture(scope="session")
def chromium_paths() -> tuple[str, str]:
    """(chromium, chromedriver), from Debian's packages."""
    return install_chromium()


@pytest.fixture
def browser(chromium_paths: tuple[str, str], tmp_path: Path) -> Iterator[webdriver.Chrome]:
    """A headless Chromium for one test (its own profile, nothing shared)."""
    binary, driver = chromium_paths
    options = Options()
    options.binary_location = binary
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,1000",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
    ):
        options.add_argument(flag)
    chrome = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    chrome.set_page_load_timeout(30)
    try:
        yield chrome
    finally:
        chrome.quit()
