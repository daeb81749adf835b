"""A real headless Chromium (Debian's chromium and chromium-driver packages) driven through
ChromeDriver with Selenium, started the way a machine with a closed network needs: no sync, no
component updates, no background requests, a fresh profile."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["CHROMIUM", "CHROMEDRIVER", "chromium", "artefacts_dir", "full_page_screenshot"]

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
_FLAGS = (
    "--headless=new",
    "--no-sandbox",  # tests run as root in CI
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1100,900",
)


def artefacts_dir() -> Path:
    """Where screenshots go: $TIERLOCAL_TEST_ARTEFACTS, else tests/artefacts in the checkout
    (ignored by git)."""
    import os

    path = Path(os.environ.get("TIERLOCAL_TEST_ARTEFACTS") or Path(__file__).resolve().parents[1] / "artefacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def chromium() -> Iterator[object]:
    """A Selenium WebDriver for a fresh headless Chromium; quit afterwards."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = Path(tempfile.mkdtemp(prefix="tierlocal-chromium-"))
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def full_page_screenshot(driver: object, path: Path) -> Path:
    """The whole page, not just the window, as a PNG (Chrome DevTools' captureBeyondViewport)."""
    import base64

    height = driver.execute_script("return document.documentElement.scrollHeight")  # type: ignore[attr-defined]
    width = driver.execute_script("return document.documentElement.scrollWidth")  # type: ignore[attr-defined]
    shot = driver.execute_cdp_cmd(  # type: ignore[attr-defined]
        "Page.captureScreenshot",
        {"format": "png", "captureBeyondViewport": True, "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}},
    )
    path.write_bytes(base64.b64decode(shot["data"]))
    return path
