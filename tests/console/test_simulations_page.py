from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import Client


@pytest.fixture
def var_dir(tmp_path: Path, settings) -> Path:  # type: ignore[no-untyped-def]
    settings.VAR_DIR = tmp_path
    return tmp_path


@pytest.mark.django_db
def test_the_last_simulations_are_listed_with_their_numbers_and_reports(
    staff: Client, var_dir: Path
) -> None:
    assert "No simulation has been run yet" in staff.get("/console/simulations").content.decode()
    call_command(
        "simulate", "--workload", "conversations", "--policies", "ll,skylb",
        "--replicas", "us-east=1,eu-west=1", "--clients", "4", "--duration", "5", "--seed", "3",
    )  # fmt: skip
    html = staff.get("/console/simulations").content.decode()
    assert html.count('class="card simulation"') == 1
    assert "<td>least_load</td>" in html and "<td>skylb</td>" in html
    # The bounds side by side: the pooled fleet, the same at the engines' start times,
    # and what the deployment reaches alone.
    assert "<th>hit / bound</th><th>hit / start</th><th>hit / reach</th>" in html
    # What the engines' tokens waited for, and had the batches been even.
    assert "<th>itl</th><th>even itl</th>" in html
    assert html.count(" ms</td><td>") >= 2  # both runs sampled tokens
    (report,) = (var_dir / "simulations").glob("*.html")
    page = staff.get(f"/console/simulations/{report.name}")
    assert page.status_code == 200 and page["Content-Type"].startswith("text/html")
    assert b"plotly" in b"".join(page.streaming_content)
    # The page loads plotly.js from beside itself: the console serves it there too.
    script = staff.get("/console/simulations/plotly.min.js")
    assert script.status_code == 200 and script["Content-Type"].startswith("text/javascript")
    assert b"plotly.js" in b"".join(script.streaming_content)[:4000]


@pytest.mark.django_db
def test_a_report_saved_before_token_waits_shows_dashes(staff: Client, var_dir: Path) -> None:
    call_command(
        "simulate", "--workload", "conversations", "--policies", "ll",
        "--replicas", "us-east=1", "--clients", "2", "--duration", "3", "--seed", "3",
    )  # fmt: skip
    (sidecar,) = (var_dir / "simulations").glob("*.json")
    saved = json.loads(sidecar.read_text())
    for summary in saved["summaries"]:
        del summary["waits"]  # as written before these fields existed
        del summary["hit_of_bound_at_start"]
        summary["hit_of_bound"] = 0.5
    sidecar.write_text(json.dumps(saved))
    html = staff.get("/console/simulations").content.decode()
    assert "<td>least_load</td>" in html
    assert "<td>-</td><td>-</td></tr>" in html
    assert "<td>0.50</td><td>-</td>" in html  # hit / bound, and no hit / start


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["../secret_key", "nothing.html", "%2e%2e%2fsecret_key"])
def test_only_saved_reports_are_served(staff: Client, var_dir: Path, name: str) -> None:
    (var_dir / "secret_key").write_text("do not serve")
    assert staff.get(f"/console/simulations/{name}").status_code == 404
