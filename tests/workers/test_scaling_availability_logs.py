"""2020 availability event logs as spot traces (``workers.scaling.availability_logs``)
and the loader that takes every kind of spot data (``workers.scaling.spot_sources``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.scaling.availability_logs import (
    LogFormatError,
    parse_log,
    traces_from_logs,
)
from workers.scaling.spot_sources import load_spot_traces

# Minute 0-1: both instances created; zone b's k80 is preempted at minute 4 and its
# replacement fails twice before one is created at minute 7.
LOG_1 = """\
[2020-03-15T10:00:00.000Z] Created instance i-a1 with 1 GPU(s) of type k80 in zone us-east-1a
[2020-03-15T10:01:00.000Z] Created instance i-b1 with 1 GPU(s) of type k80 in zone us-east-1b
[2020-03-15T10:02:00.000Z] Instance i-a1 running in zone us-east-1a
[2020-03-15T10:02:01.000Z] Instance i-b1 running in zone us-east-1b

[2020-03-15T10:04:00.000Z] Instance i-b1 not running in zone us-east-1b
[2020-03-15T10:04:01.000Z] Successfully deleted instance i-b1
[2020-03-15T10:05:00.000Z] Instance with 1 GPU(s) of type k80 creation failed
[2020-03-15T10:06:00.000Z] Instance with 1 GPU(s) of type k80 creation failed
[2020-03-15T10:07:00.000Z] Created instance i-b2 with 1 GPU(s) of type k80 in zone us-east-1b
[2020-03-15T10:09:00.000Z] Instance i-a1 running in zone us-east-1a
"""
# Another logger, another zone and type, overlapping in time.
LOG_2 = """\
[2020-03-15T10:00:30.000Z] Created instance i-c1 with 8 GPU(s) of type V100 in zone us-east-1c
[2020-03-15T10:03:00.000Z] Created instance i-c2 with 1 GPU(s) of type k80 in zone us-east-1c
[2020-03-15T10:08:00.000Z] Instance i-c1 not running in zone us-east-1c
"""


def test_a_log_becomes_one_binary_trace_per_instance_type() -> None:
    events = parse_log(LOG_1, "log-1")
    assert [e.kind for e in events][:3] == ["created", "created", "running"]
    assert events[6].kind == "creation-failed" and events[6].instance_type == "k80x1"
    (trace,), summary = traces_from_logs("t", [events], gap_s=60.0)
    assert trace.name == "t/k80x1" and trace.binary and trace.gap_s == 60.0
    # Samples at minutes 0..9: b is down from its preemption (minute 4) until the
    # replacement is created (minute 7); a is up from its creation to the end.
    assert list(trace.zones["us-east-1a"]) == [1] * 10
    assert list(trace.zones["us-east-1b"]) == [0, 1, 1, 1, 0, 0, 0, 1, 1, 1]
    assert (summary.preemptions, summary.creation_failures, summary.files) == (1, 2, 1)
    assert trace.capacity("us-east-1b", 5 * 60.0) == 0


def test_several_logs_merge_into_one_multi_zone_timeline() -> None:
    logs = [parse_log(LOG_1, "log-1"), parse_log(LOG_2, "log-2")]
    traces, summary = traces_from_logs("merged", logs, gap_s=60.0)
    by_name = {t.name: t for t in traces}
    assert sorted(by_name) == ["merged/k80x1", "merged/v100x8"]
    assert sorted(by_name["merged/k80x1"].zones) == ["us-east-1a", "us-east-1b", "us-east-1c"]
    assert list(by_name["merged/k80x1"].zones["us-east-1c"]) == [0, 0, 0, 1, 1, 1, 1, 1, 1, 1]
    # The V100 in zone c: created at 0:30, first sample at minute 1, gone at minute 8.
    assert list(by_name["merged/v100x8"].zones["us-east-1c"]) == [0, 1, 1, 1, 1, 1, 1, 1, 0, 0]
    assert summary.zones == ("us-east-1a", "us-east-1b", "us-east-1c")
    assert summary.instance_types == ("k80x1", "v100x8") and summary.files == 2


def test_an_unexpected_line_is_refused_naming_the_expected_format() -> None:
    with pytest.raises(LogFormatError, match=r"log-x:2: .*is not a spot availability event log"):
        parse_log(LOG_2.splitlines()[0] + "\nzone,time,price\n", "log-x")
    with pytest.raises(LogFormatError, match="not an ISO-8601 time; expected a spot availability"):
        parse_log("[yesterday] Successfully deleted instance i-1\n", "log-y")
    with pytest.raises(LogFormatError, match="no events"):
        parse_log("\n\n", "log-z")
    with pytest.raises(ValueError, match="gap_s must be positive"):
        traces_from_logs("t", [parse_log(LOG_2, "log-2")], gap_s=0)


def test_loader_takes_every_kind_of_spot_data_and_says_what_it_merged(tmp_path: Path) -> None:
    folder = tmp_path / "availability"
    folder.mkdir()
    (folder / "persistent_1.out").write_text(LOG_1)
    (folder / "persistent_2.out").write_text(LOG_2)
    traces, note = load_spot_traces(folder)
    assert [t.name for t in traces] == ["availability/k80x1", "availability/v100x8"]
    assert note is not None and "merged 2 availability log(s)" in note
    assert "one multi-zone timeline" in note and "us-east-1a, us-east-1b, us-east-1c" in note
    single, note = load_spot_traces(folder / "persistent_2.out")
    assert [t.name for t in single] == ["persistent_2/k80x1", "persistent_2/v100x8"]

    (tmp_path / "prices.csv").write_text("zone,price\n")
    with pytest.raises(ValueError, match=r"unknown spot data; expected a SkyPilot spot trace"):
        load_spot_traces(tmp_path / "prices.csv")
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ValueError, match=r'not a spot trace; expected \{"metadata"'):
        load_spot_traces(tmp_path / "broken.json")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no spot data; expected"):
        load_spot_traces(empty)
