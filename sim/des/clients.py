"""Simulated clients: programs of dependent steps, closed or open loop, per region.

The same ``sim.workloads`` objects the HTTP replayer uses (``Program``,
``Step.render``, ``ClosedLoopDispatcher``, ``OpenLoop``), driven in virtual time
with ``ops.replay.runner``'s rules: a step is sent once every step it waits
on succeeded (its prompt quotes their replies; a failed dependency skips it),
siblings go out together, and a closed-loop client takes its next program when
its current one is done (SkyLB §5.1: "each client issues one program at a
time").

A request is tokenized and block-hashed once, by the balancer's own functions
(``core.tokenizer.render_chat`` + ``Tokenizer.encode`` and
``core.blocks.block_hashes``, as ``openai_request.describe`` does); its
reply text is the engine's tokens through the replicas' ``Vocabulary``, so the
next turn carries the very tokens the engine cached.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from core.blocks import BLOCK_SIZE, block_hashes
from core.length_predictor import RequestFeatures, last_user_text, word_cues
from core.prompts import is_first_turn
from core.tokenizer import Tokenizer, render_chat
from core.types import RequestDescriptor
from sim.des.calls import CallResult, Journey, SimCall
from sim.des.config import MODEL
from sim.des.loop import EventLoop
from sim.engine import Vocabulary
from sim.workloads import ApiKind, ClosedLoop, ClosedLoopDispatcher, OpenLoop, Program, Request

Done = Callable[[CallResult], None]


@dataclass(slots=True)
class RequestRecord:
    """One client request from send to answer, as the client saw it."""

    request_id: str
    region: str
    sent_at: float
    prompt_tokens: int
    first_at: float | None = None
    done_at: float | None = None
    ok: bool = False
    status: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    journey: Journey = field(default_factory=Journey)
    # The oracle bounds' view (sim.des.oracle): the prompt's block keys, and the
    # blocks its reply completed (continuing the chain), as the engine caches them.
    prompt_keys: tuple[int, ...] = ()
    reply_keys: tuple[int, ...] = ()
    # The program it is a step of (a conversation, a tree), named per region in the
    # order programs started, and the step's index in it: what links a turn to the
    # turn before it in a reader's own breakdown (``sim.des.records``).
    program: str = ""
    step: int = 0

    @property
    def ttft(self) -> float | None:
        return None if self.first_at is None else self.first_at - self.sent_at

    @property
    def e2e(self) -> float | None:
        return None if self.done_at is None else self.done_at - self.sent_at


class Budget:
    """When clients stop sending: after ``duration_s`` or ``max_requests`` requests."""

    def __init__(self, duration_s: float | None, max_requests: int | None, start_s: float = 0.0):
        self.duration_s = duration_s
        self.max_requests = max_requests
        self.start_s = start_s
        self.sent = 0

    def spent(self, now: float) -> bool:
        late = self.duration_s is not None and now >= self.start_s + self.duration_s
        full = self.max_requests is not None and self.sent >= self.max_requests
        return late or full


@dataclass(frozen=True)
class ClientContext:
    """What every region's clients share: tokenizer, vocabulary, budget, records."""

    loop: EventLoop
    tokenizer: Tokenizer
    vocab: Vocabulary
    hash_seed: str
    budget: Budget
    records: list[RequestRecord]
    # The engine's true output length for (prompt ids, max_tokens, ignore_eos): set
    # only for the oracle predictor, which reads it from the request's features.
    oracle: Callable[[list[int], int, bool], int] | None = None


class RegionClients:
    """Every client of one region, sending to ``submit`` (its entry balancer)."""

    def __init__(
        self, region: str, ctx: ClientContext, submit: Callable[[SimCall], None], one_way_s: float
    ) -> None:
        self.region, self.ctx, self.submit, self.one_way_s = region, ctx, submit, one_way_s
        self.loop = ctx.loop
        self.running = 0  # programs started and not finished
        self.arrival_pending = False  # an open-loop arrival is scheduled
        self._ids = 0
        self._programs = 0

    def idle(self) -> bool:
        """Nothing running and nothing more to come (budget spent or source exhausted)."""
        return not self.running and not self.arrival_pending

    # -- arrivals --------------------------------------------------------------------

    def start_closed(self, arrivals: ClosedLoop, programs: Iterator[Program]) -> None:
        dispatcher = arrivals.dispatcher(programs)
        for client, program in dispatcher.start():
            delay = arrivals.start_delay(client)
            self.loop.call_later(delay, self._run_closed, dispatcher, client, program)

    def _run_closed(self, dispatcher: ClosedLoopDispatcher, client: int, program: Program) -> None:
        ProgramRun(self, program, lambda: self._next(dispatcher, client)).start()

    def _next(self, dispatcher: ClosedLoopDispatcher, client: int) -> None:
        if self.ctx.budget.spent(self.loop.now):
            return
        program = dispatcher.finish(client)
        if program is not None:
            self._run_closed(dispatcher, client, program)

    def start_open(self, arrivals: OpenLoop, programs: Iterator[Program]) -> None:
        self.loop.call_soon(self._arrive, arrivals.schedule(programs), self.loop.now)

    def _arrive(self, scheduled: Iterator[Program], origin: float) -> None:
        # One arrival event at a time: a long (or endless) trace is read lazily.
        program = next(scheduled, None)
        at = origin + (program.start if program is not None else 0.0)
        self.arrival_pending = not (program is None or self.ctx.budget.spent(at))
        if program is not None and self.arrival_pending:
            self.loop.call_at(at, self._open_program, program, scheduled, origin)

    def _open_program(self, program: Program, scheduled: Iterator[Program], origin: float) -> None:
        self.arrival_pending = False
        ProgramRun(self, program, lambda: None).start()
        self._arrive(scheduled, origin)

    def next_program(self) -> str:
        """A name for the program starting now: the region and its start order."""
        self._programs += 1
        return f"{self.region}-p{self._programs}"

    # -- one request -----------------------------------------------------------------

    def send(self, request: Request, on_done: Done, *, program: str = "", step: int = 0) -> bool:
        """Issue ``request``, step ``step`` of ``program``; False when the budget is
        spent (it is not sent)."""
        ctx = self.ctx
        if ctx.budget.spent(self.loop.now):
            return False
        ctx.budget.sent += 1
        text = render_chat(request.messages) if request.kind is ApiKind.CHAT else request.prompt
        tokens = ctx.tokenizer.encode(text)
        self._ids += 1
        record = RequestRecord(
            f"{self.region}-{self._ids}", self.region, self.loop.now, len(tokens)
        )
        record.program, record.step = program, step
        ctx.records.append(record)
        record.prompt_keys = tuple(block_hashes(tokens, seed=ctx.hash_seed))
        descriptor = RequestDescriptor(
            request_id=record.request_id,
            model=MODEL,
            prompt_tokens=len(tokens),
            block_hashes=record.prompt_keys,
            session_key=request.session_key,
            max_tokens=request.max_tokens,
            first_turn=request.kind is ApiKind.CHAT and is_first_turn(request.messages),
            features=self._features(request, text, tokens),
        )
        call = SimCall(
            descriptor,
            tokens,
            request.max_tokens,
            request.ignore_eos,
            record.journey,
            on_first=lambda: self.loop.call_later(self.one_way_s, self._first, record),
            on_done=lambda result: self.loop.call_later(
                self.one_way_s, self._done, record, result, on_done, tokens
            ),
        )
        self.loop.call_later(self.one_way_s, self.submit, call)
        return True

    def _reply_keys(self, record: RequestRecord, prompt: list[int], reply: tuple[int, ...]) -> None:
        """Key the blocks the reply completed: the prompt's partial last block plus the
        reply, chained on from the prompt's last full block (as the engine hashes them)."""
        full = len(record.prompt_keys) * BLOCK_SIZE
        parent = record.prompt_keys[-1] if record.prompt_keys else None
        tail = [*prompt[full:], *reply]
        record.reply_keys = tuple(block_hashes(tail, seed=self.ctx.hash_seed, parent=parent))

    def _features(self, request: Request, text: str, tokens: list[int]) -> RequestFeatures:
        """What core.openai_request.describe gives the predictor, plus the
        truth for the oracle."""
        if request.kind is ApiKind.CHAT:
            cues = word_cues(last_user_text(request.messages))
            endpoint = "chat"
        else:
            cues, endpoint = word_cues(text), "completions"
        oracle = self.ctx.oracle
        truth = oracle(tokens, request.max_tokens, request.ignore_eos) if oracle else None
        return RequestFeatures(len(tokens), endpoint=endpoint, cues=cues, oracle_output=truth)

    def _first(self, record: RequestRecord) -> None:
        if record.first_at is None:
            record.first_at = self.loop.now

    def _done(
        self, record: RequestRecord, result: CallResult, on_done: Done, prompt: list[int]
    ) -> None:
        record.done_at, record.ok, record.status = self.loop.now, result.ok, result.status
        if result.ok:
            self._reply_keys(record, prompt, result.tokens)
        record.cached_tokens, record.completion_tokens = (
            result.cached_tokens,
            result.completion_tokens,
        )
        record.prompt_tokens = result.prompt_tokens or record.prompt_tokens
        on_done(result)

    def reply_text(self, result: CallResult) -> str:
        return self.ctx.vocab.text(list(result.tokens))


class ProgramRun:
    """One program's steps, each sent when the steps it waits on have succeeded."""

    def __init__(
        self, clients: RegionClients, program: Program, finished: Callable[[], None]
    ) -> None:
        self.clients, self.program, self.finished = clients, program, finished
        self.name = clients.next_program()
        self.replies: dict[int, str] = {}
        self.waiting_on = [len(step.after) for step in program.steps]
        self.children: list[list[int]] = [[] for _ in program.steps]
        for index, step in enumerate(program.steps):
            for dep in step.after:
                self.children[dep].append(index)
        self.open = 0

    def start(self) -> None:
        self.clients.running += 1
        for index in self.program.roots():
            self._send(index)
        if not self.open:
            self._finish()  # nothing could be sent: the budget is spent

    def _finish(self) -> None:
        self.clients.running -= 1
        self.finished()

    def _send(self, index: int) -> None:
        step = self.program.steps[index]
        request = step.render(self.replies, self.program.session_key)
        done = functools.partial(self._done, index)
        if self.clients.send(request, done, program=self.name, step=index):
            self.open += 1

    def _done(self, index: int, result: CallResult) -> None:
        self.open -= 1
        if result.ok:
            self.replies[index] = self.clients.reply_text(result)
            for child in self.children[index]:
                self.waiting_on[child] -= 1
                if self.waiting_on[child] == 0:
                    self._send(child)
        if not self.open:
            self._finish()
