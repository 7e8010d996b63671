"""The traffic replayer: the runner's scheduling with a fake sender, then the runner
and ``manage.py replay`` against a real emulated replica speaking the OpenAI API."""

from __future__ import annotations

import asyncio
import re
import signal
from collections.abc import Callable
from pathlib import Path

import httpx2
import openai
import pytest
from django.core.management import CommandError

from fleet.models import Balancer, Region
from ops.replay.display import StatusLine
from ops.replay.runner import ReplayLimits, ReplayRunner
from ops.replay.sender import ApiKeyRejected, OpenAISender, first_model, make_client
from ops.replay.service import demo_replay_argv
from ops.replay.stats import Outcome, ReplaySnapshot, ReplayStats
from sim.workloads import ClosedLoop, OpenLoop, Request, parse_workload
from tests.support.commands import run_command
from tests.support.polling import log_shows
from tests.support.processes import ProcessGroup, free_port, wait_http
from tests.support.workloads import first


class FakeSender:
    """Answers every request after ``delay`` seconds; ``answer`` may turn one into an
    error.  Records what it was sent and how many requests overlapped at most."""

    def __init__(
        self, delay: float = 0.0, answer: Callable[[int, Request], Outcome | None] | None = None
    ) -> None:
        self.delay = delay
        self.answer = answer
        self.requests: list[Request] = []
        self.active = 0
        self.peak = 0

    async def send(self, request: Request) -> Outcome:
        number = len(self.requests)
        self.requests.append(request)
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.active -= 1
        custom = self.answer(number, request) if self.answer else None
        return custom or Outcome(
            ok=True, latency=self.delay, reply=f"answer{number}", ttft=0.001, prompt_tokens=10
        )


def run(runner: ReplayRunner) -> ReplaySnapshot:
    return asyncio.run(runner.run())


def failure(status: int) -> Outcome:
    return Outcome(ok=False, latency=0.0, status=status, error_kind=f"HTTP {status}", error="no")


# -- the runner, no network ------------------------------------------------------------


def test_a_ramp_starts_closed_loop_clients_at_their_share_of_it() -> None:
    async def sent_at(arrivals: ClosedLoop) -> list[float]:
        sender = FakeSender(delay=1.0)  # each client's first request is all it sends
        loop, times = asyncio.get_running_loop(), []
        send = sender.send

        async def timed(request: Request) -> Outcome:
            times.append(loop.time())
            return await send(request)

        sender.send = timed  # type: ignore[method-assign]
        programs = parse_workload("system-prompts").programs()
        limits = ReplayLimits(max_requests=3)
        snapshot = await ReplayRunner(programs, arrivals, sender, limits=limits).run()
        assert snapshot.ok == 3
        return [t - times[0] for t in times]

    # Sleeps end no earlier than asked: each client's first request at least its
    # share of the ramp after the first one's.
    offsets = asyncio.run(sent_at(ClosedLoop(3, ramp_s=0.6)))
    assert offsets[1] >= 0.19 and offsets[2] >= 0.39
    # Without one, all three are sent before the first answer (1 s) comes back.
    assert max(asyncio.run(sent_at(ClosedLoop(3)))) < 1.0


def test_closed_loop_keeps_one_program_per_client_in_flight() -> None:
    sender = FakeSender(delay=0.01)
    runner = ReplayRunner(
        parse_workload("system-prompts").programs(),
        ClosedLoop(3),
        sender,
        limits=ReplayLimits(max_requests=12),
    )
    snapshot = run(runner)
    assert (snapshot.sent, snapshot.ok, len(sender.requests)) == (12, 12, 12)
    assert sender.peak == 3


def test_open_loop_sends_follow_ups_with_the_previous_reply() -> None:
    sender = FakeSender()
    workload = parse_workload("conversations:turns_min=3,turns_max=3")
    # Two conversations arriving together (untimed programs all start at offset 0), so
    # their turns interleave: each follow-up must quote its own conversation's reply.
    snapshot = run(ReplayRunner(first(workload, 2), OpenLoop(), sender))
    assert (snapshot.sent, snapshot.ok) == (6, 6)
    turns: dict[str, list[int]] = {}
    for number, request in enumerate(sender.requests):
        turns.setdefault(request.session_key, []).append(number)
    assert sorted(map(len, turns.values())) == [3, 3]
    for numbers in turns.values():
        opening, follow_up, last = (sender.requests[n] for n in numbers)
        assert all(message["role"] != "assistant" for message in opening.messages)
        assert follow_up.messages[-2] == {"role": "assistant", "content": f"answer{numbers[0]}"}
        assert last.messages[: len(follow_up.messages)] == follow_up.messages
        assert last.messages[-2] == {"role": "assistant", "content": f"answer{numbers[1]}"}


def test_a_failed_turn_ends_its_conversation_and_is_counted() -> None:
    sender = FakeSender(answer=lambda number, _: failure(503) if number == 0 else None)
    workload = parse_workload("conversations:turns_min=4,turns_max=4")
    snapshot = run(ReplayRunner(first(workload, 1), OpenLoop(rate=1.0), sender))
    assert len(sender.requests) == 1  # later turns would quote a reply that never came
    assert (snapshot.failed, snapshot.errors, snapshot.in_flight) == (1, {"HTTP 503": 1}, 0)


def test_a_401_before_any_success_aborts_the_run() -> None:
    sender = FakeSender(answer=lambda number, _: failure(401))
    runner = ReplayRunner(parse_workload("system-prompts").programs(), ClosedLoop(2), sender)
    with pytest.raises(ApiKeyRejected, match="--api-key or set MERIDIAN_API_KEY"):
        run(runner)


def test_stop_cancels_in_flight_requests_and_still_summarises() -> None:
    sender = FakeSender(delay=3600.0)
    runner = ReplayRunner(parse_workload("tot").programs(), ClosedLoop(2), sender)

    async def stop_soon() -> ReplaySnapshot:
        asyncio.get_running_loop().call_later(0.05, runner.stop)
        return await runner.run()

    snapshot = asyncio.run(stop_soon())
    assert snapshot.sent == snapshot.cancelled == 2  # the two tree roots
    assert snapshot.in_flight == 0


def test_duration_bounds_an_endless_workload() -> None:
    sender = FakeSender(delay=0.001)
    runner = ReplayRunner(
        parse_workload("system-prompts").programs(),
        OpenLoop(rate=200.0),
        sender,
        limits=ReplayLimits(duration=0.3),
    )
    snapshot = run(runner)
    assert 0 < snapshot.ok == len(sender.requests) - snapshot.cancelled


def test_demo_argv_is_a_valid_replay_invocation() -> None:
    argv = demo_replay_argv("us-east", rate=1.0)
    assert argv == [
        "replay",
        "--workload",
        "conversations",
        "--region",
        "us-east",
        "--rate",
        "1",
        "--seed",
        "0",
    ]


def sdk_client(status: int, body: dict[str, object]) -> openai.AsyncOpenAI:
    """An SDK client whose every request gets ``status`` with an OpenAI error ``body``."""
    transport = httpx2.MockTransport(lambda request: httpx2.Response(status, json=body))
    return openai.AsyncOpenAI(
        base_url="http://gateway.test/v1",
        api_key="mk-wrong",
        max_retries=0,
        http_client=httpx2.AsyncClient(transport=transport),
    )


def test_listing_models_with_a_bad_key_explains_the_key() -> None:
    client = sdk_client(401, {"error": {"message": "Invalid API key", "type": "auth"}})
    with pytest.raises(ApiKeyRejected, match=r"Invalid API key.*--api-key or set MERIDIAN_API_KEY"):
        asyncio.run(first_model(client))


def test_sender_turns_an_http_error_into_a_counted_outcome() -> None:
    client = sdk_client(503, {"error": {"message": "no replica available", "type": "overloaded"}})
    request = next(parse_workload("system-prompts").programs()).steps[0].render({}, "user-1")
    outcome = asyncio.run(OpenAISender(client, "m").send(request))
    assert (outcome.ok, outcome.status, outcome.error_kind) == (False, 503, "HTTP 503")
    assert "no replica available" in outcome.error


def snapshot_at(elapsed: float) -> ReplaySnapshot:
    now = [0.0]
    stats = ReplayStats(clock=lambda: now[0])
    stats.start()
    stats.request_started()
    stats.request_finished(
        Outcome(
            ok=True,
            latency=0.2,
            ttft=0.05,
            prompt_tokens=100,
            cached_tokens=40,
            completion_tokens=20,
        )
    )
    stats.request_started()
    stats.request_finished(failure(503))
    now[0] = elapsed
    return stats.snapshot()


def test_status_line_redraws_in_place_on_a_tty() -> None:
    written: list[str] = []
    line = StatusLine(written.append, tty=True)
    line.update(snapshot_at(1.0))
    line.update(snapshot_at(2.0))
    line.close()
    assert [text[0] for text in written[:2]] == ["\r", "\r"]
    assert "errors 1 (HTTP 503: 1)" in written[0]
    assert "TTFT p50 50ms" in written[0] and "cached 40%" in written[0]
    assert written[-1] == "\n"


def test_status_line_prints_periodic_lines_into_a_log() -> None:
    written: list[str] = []
    line = StatusLine(written.append, tty=False, plain_every_s=10.0)
    for second in range(1, 23):
        line.update(snapshot_at(float(second)))
    assert len(written) == 3  # at 1 s, 11 s and 21 s
    assert all(text.endswith("\n") and "\r" not in text for text in written)


# -- against a real emulated replica ---------------------------------------------------


@pytest.fixture
def replica_url(processes: ProcessGroup) -> str:
    port = free_port()
    replica = processes.python(
        "replica", "-m", "sim.serve", "--replica", f"r1={port}", "--time-scale", "0.02"
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/health", process=replica)
    return url


class RecordingSender(OpenAISender):
    """The real sender, keeping each request and its reply for inspection."""

    def __init__(self, client: openai.AsyncOpenAI, model: str) -> None:
        super().__init__(client, model)
        self.log: list[tuple[Request, Outcome]] = []

    async def send(self, request: Request) -> Outcome:
        outcome = await super().send(request)
        self.log.append((request, outcome))
        return outcome


@pytest.mark.integration
def test_runner_replays_conversations_against_a_replica(replica_url: str) -> None:
    async def replay() -> tuple[ReplaySnapshot, RecordingSender]:
        async with make_client(replica_url, "") as client:
            sender = RecordingSender(client, "meridian-demo")
            runner = ReplayRunner(
                parse_workload("conversations:turns_min=3,turns_max=4", seed=1).programs(),
                ClosedLoop(4),
                sender,
                limits=ReplayLimits(max_requests=24),
            )
            return await runner.run(), sender

    snapshot, sender = asyncio.run(replay())
    assert (snapshot.sent, snapshot.ok, snapshot.failed) == (24, 24, 0)
    assert snapshot.cached_share > 0  # later turns hit the replica's prefix cache
    assert snapshot.ttft_p50 is not None
    replies = {outcome.reply for _, outcome in sender.log}
    follow_ups = [r for r, _ in sender.log if any(m["role"] == "assistant" for m in r.messages)]
    assert follow_ups
    for request in follow_ups:
        quoted = [m["content"] for m in request.messages if m["role"] == "assistant"]
        assert all(text in replies and text for text in quoted)


def summary_value(output: str, label: str) -> str:
    match = re.search(rf"^{re.escape(label)}\s+(.*)$", output, re.MULTILINE)
    assert match, output
    return match.group(1)


@pytest.mark.integration
def test_command_replays_tree_of_thought_and_prints_the_summary(replica_url: str) -> None:
    text = run_command(
        "replay",
        "--workload",
        "tot:depth=3",
        "--base-url",
        replica_url,
        "--clients",
        "2",
        "--max-requests",
        "14",
        "--quiet",
    )
    assert "model meridian-demo" in text  # found through GET /v1/models
    assert summary_value(text, "requests sent") == "14"
    assert summary_value(text, "succeeded") == "14"
    assert summary_value(text, "failed") == "0"


@pytest.mark.django_db
@pytest.mark.integration
def test_region_option_finds_the_balancer_url(replica_url: str) -> None:
    # The replica speaks the same API as a balancer, so it can stand in for one here.
    region = Region.objects.create(name="us-east")
    Balancer.objects.create(name="lb-us-east", region=region, url=replica_url)
    text = run_command(
        "replay",
        "--workload",
        "system-prompts",
        "--region",
        "us-east",
        "--rate",
        "50",
        "--max-requests",
        "5",
        "--quiet",
    )
    assert summary_value(text, "succeeded") == "5"


@pytest.mark.django_db
def test_region_without_a_balancer_is_a_clear_error() -> None:
    with pytest.raises(CommandError, match="no balancer in region 'mars'"):
        run_command(
            "replay",
            "--workload",
            "conversations",
            "--region",
            "mars",
        )


def test_unreachable_url_is_counted_as_connection_errors() -> None:
    text = run_command(
        "replay",
        "--workload",
        "system-prompts",
        "--base-url",
        f"http://127.0.0.1:{free_port()}",
        "--model",
        "m",
        "--rate",
        "100",
        "--max-requests",
        "3",
    )
    assert summary_value(text, "failed") == "3"
    assert "error connection x3: Connection error." in text
    assert summary_value(text, "succeeded") == "0"


def test_bad_workload_is_a_command_error() -> None:
    with pytest.raises(CommandError, match="unknown workload 'nope'"):
        run_command(
            "replay",
            "--workload",
            "nope",
            "--base-url",
            "http://127.0.0.1:1",
        )


def test_malformed_trace_line_is_a_command_error_naming_it(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 8, "output_length": 2, "hash_ids": [0]}\n'
        '{"timestamp": 5, "input_length": 8\n'
    )
    with pytest.raises(CommandError, match=f"{trace}:2: not valid JSON"):
        run_command(
            "replay",
            "--workload",
            f"mooncake:{trace}",
            "--model",
            "m",
            "--base-url",
            f"http://127.0.0.1:{free_port()}",
        )


@pytest.mark.integration
def test_sigterm_stops_the_command_cleanly_with_a_summary(
    processes: ProcessGroup, replica_url: str
) -> None:
    replay = processes.python(
        "replay",
        "manage.py",
        "replay",
        "--workload",
        "conversations",
        "--base-url",
        replica_url,
        "--rate",
        "20",
    )
    log_shows(processes, "replay", replay, "sent")
    replay.send_signal(signal.SIGTERM)
    assert replay.wait(timeout=20) == 0
    log = processes.log_of("replay")
    assert "Replay summary" in log
    assert int(summary_value(log, "succeeded")) > 0
