"""Headless Chromium for console tests (Debian's ``chromium`` + ``chromium-driver``,
installed by ``make test``), driven through Selenium, and the console's own stack:
a daphne console process and a Celery worker with beat on a private queue.

Launch flags suit a closed network (no background fetches, no component updates,
no sync); every browser gets a fresh profile directory, so no session leaks between
tests.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from tests.support.processes import ProcessGroup, free_port, wait_http

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--window-size=1440,900",
)
T = TypeVar("T")


def available() -> bool:
    return CHROMIUM.exists() and CHROMEDRIVER.exists()


@contextmanager
def chromium() -> Iterator[WebDriver]:
    with tempfile.TemporaryDirectory(prefix="meridian-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for flag in (*FLAGS, f"--user-data-dir={profile}"):
            options.add_argument(flag)
        driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
        try:
            driver.set_window_size(1440, 900)
            yield driver
        finally:
            driver.quit()


def log_in(driver: WebDriver, base_url: str, username: str, password: str) -> None:
    """The admin login form, as a person fills it in."""
    driver.get(f"{base_url}/admin/login/?next=/")
    driver.find_element("name", "username").send_keys(username)
    driver.find_element("name", "password").send_keys(password)
    driver.find_element("css selector", "input[type=submit]").click()
    wait_for(driver, lambda d: d.find_elements("css selector", ".card[data-region]"), "overview")


def wait_for(
    driver: WebDriver, check: Callable[[WebDriver], T], what: str, timeout: float = 30
) -> T:
    """Poll the page until ``check`` is truthy (a readiness wait, not a timing claim)."""
    wait = WebDriverWait(
        driver, timeout, poll_frequency=0.1, ignored_exceptions=(StaleElementReferenceException,)
    )
    return wait.until(check, message=f"{what}: not seen within {timeout}s")


def text_of(driver: WebDriver, css: str) -> str:
    """The rendered text of the first element ``css`` matches, read in one script.

    The live pages replace nodes as updates stream in.  An element found in one
    WebDriver command can be gone by the next, when its text is asked for, and
    Chrome then answers "Node with given id does not belong to the document" (not
    a stale-element error that a wait would poll past).  One script finds and
    reads the node in the same turn of the page's event loop.
    """
    text = driver.execute_script(_TEXT_OF_FIRST, css)
    if text is None:
        raise NoSuchElementException(f"no element matches {css!r}")
    return str(text)


def texts_of(driver: WebDriver, css: str) -> list[str]:
    """The rendered text of every element ``css`` matches, read in one script (see
    ``text_of``): empty while none does, so a wait can poll on it."""
    return [str(text) for text in driver.execute_script(_TEXT_OF_ALL, css)]


_TEXT_OF_FIRST = "const e = document.querySelector(arguments[0]); return e && e.innerText;"
_TEXT_OF_ALL = "return Array.from(document.querySelectorAll(arguments[0]), (e) => e.innerText);"


def start_console(group: ProcessGroup, env: dict[str, str]) -> str:
    """A daphne console process (HTTP + the live WebSocket); returns its URL."""
    port = free_port()
    argv = ["-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "meridian.asgi:application"]
    process = group.python("console", *argv, env=env)
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/admin/login/", process=process, timeout=60)
    return url


def start_worker(group: ProcessGroup, env: dict[str, str], schedule_dir: Path) -> Any:
    """Celery worker with embedded beat, on its own queue so that no other worker
    sharing this Redis takes its tasks."""
    argv = [
        "-m", "celery", "-A", "meridian", "worker", "--beat", "--concurrency", "2",
        "--loglevel", "WARNING", "--schedule", str(schedule_dir / "celerybeat-schedule"),
        "-Q", env["MERIDIAN_CELERY_QUEUE"],
    ]  # fmt: skip
    return group.python("celery", *argv, env=env)
