"""`manage.py screenshots`: a 1440x900 PNG of every console page, for the README.

Points headless Chromium (Debian's ``chromium`` + ``chromium-driver``, the browser
the tests use) at a running console (``make run``: http://127.0.0.1:8000), logs in as
the demo admin (password from ``var/admin_password`` unless given), waits until live
data has arrived on each page, and writes ``docs/screenshots/<page>.png``.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from selenium import webdriver
from selenium.common.exceptions import TimeoutException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

PAGES = {
    "overview": "/",
    "charts": "/console/charts",
    "cost": "/console/cost",
    "replicas": "/console/replicas",
    "regions": "/console/regions",
    "events": "/console/events",
    "drills": "/console/drills",
    "service": "/console/service",
    "simulations": "/console/simulations",
}
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--hide-scrollbars",
    "--window-size=1440,900",
)


@contextmanager
def headless_chromium() -> Iterator[WebDriver]:
    with tempfile.TemporaryDirectory(prefix="meridian-shots-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = "/usr/bin/chromium"
        for flag in (*FLAGS, f"--user-data-dir={profile}"):
            options.add_argument(flag)
        driver = webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))
        try:
            # The viewport itself, not the window around it, is 1440x900.
            metrics = {"width": 1440, "height": 900, "deviceScaleFactor": 1, "mobile": False}
            driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
            yield driver
        finally:
            driver.quit()


class Command(BaseCommand):
    help = "Save a 1440x900 screenshot of every console page under docs/screenshots/."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--base-url", default="http://127.0.0.1:8000")
        parser.add_argument("--username", default="admin")
        parser.add_argument("--password", default="", help="default: var/admin_password")
        parser.add_argument("--out", default=str(Path(settings.BASE_DIR) / "docs" / "screenshots"))
        parser.add_argument("--settle", type=float, default=3.0, help="seconds of live data")

    def handle(self, *args: Any, **options: Any) -> None:
        password = options["password"] or self.stored_password()
        out = Path(options["out"])
        out.mkdir(parents=True, exist_ok=True)
        try:
            with headless_chromium() as driver:
                self.log_in(driver, options["base_url"], options["username"], password)
                for name, path in PAGES.items():
                    target = out / f"{name}.png"
                    self.shoot(driver, options["base_url"] + path, target, options["settle"])
                    self.stdout.write(f"{target}")
        except WebDriverException as exc:
            raise CommandError(f"browser failed: {exc.msg}") from exc

    def stored_password(self) -> str:
        path = Path(settings.VAR_DIR) / "admin_password"
        if not path.exists():
            raise CommandError(f"no {path}: start the demo (make run) or pass --password")
        return path.read_text().strip()

    def log_in(self, driver: WebDriver, base: str, username: str, password: str) -> None:
        driver.get(f"{base}/admin/login/?next=/")
        driver.find_element("name", "username").send_keys(username)
        driver.find_element("name", "password").send_keys(password)
        driver.find_element("css selector", "input[type=submit]").click()
        if "/admin/login/" in driver.current_url:
            raise CommandError(f"could not log in as {username} at {base}")

    def shoot(self, driver: WebDriver, url: str, target: Path, settle: float) -> None:
        driver.get(url)
        try:
            # Live pages first show "connecting"; wait for data, then let charts fill.
            WebDriverWait(driver, 20, poll_frequency=0.2).until(
                lambda d: d.find_element("id", "live-status").text == "live"
            )
        except TimeoutException:
            self.stderr.write(f"{url}: no live data within 20 s; shot as it is")
        driver.execute_script("return new Promise(r => setTimeout(r, arguments[0]))", settle * 1000)
        driver.save_screenshot(str(target))
