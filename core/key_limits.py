"""Per-key limits: what a key may do, the admission verdict and the ``x-ratelimit-*`` headers.

An API key may carry five limits, each optional (``None``: no limit):

* ``requests_per_minute`` and ``tokens_per_minute``: fixed one-minute windows aligned to
  the store's clock (minute ``floor(now_ms / 60000)``).  A fixed window is exact: within a
  window at most ``limit`` requests are admitted, whatever the number of balancer
  processes (a sliding-window approximation is not), at the price of a burst of up to
  twice the limit across a window boundary.
* ``max_concurrent``: requests of the key in flight at once, over every process.
* ``token_budget`` per ``budget_period`` (a fixed period aligned to the epoch, UTC):
  running out answers ``insufficient_quota`` rather than ``rate_limit_exceeded``.
* ``allowed_models``: the models the key may use (empty: all of them).

Tokens are reserved at admission (the prompt plus ``max_tokens``, or an estimate when the
request sets none: ``reservation``) and settled with the real usage when the request ends.

This module decides and formats; the shared counters live in Redis
(``routing.key_limits`` runs the same decision, ``decide``, atomically inside one Lua
script) or, while Redis is unreachable, in a process-local ``LocalLedger``.  Pure: the
caller passes the time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum

from core.errors import ApiError

WINDOW_MS = 60_000
BUDGET_PERIODS: Mapping[str, int] = {
    "hour": 3_600,
    "day": 86_400,
    "week": 7 * 86_400,
    "month": 30 * 86_400,  # thirty days: a fixed length keeps the periods aligned
}
DEFAULT_BUDGET_PERIOD = "month"
# The completion tokens reserved for a request that sets no max_tokens.
DEFAULT_COMPLETION_ESTIMATE = 256
# The most a limit may be: larger values are typos, and Lua numbers are doubles.
MAX_LIMIT = 10**12
INSUFFICIENT_QUOTA = "insufficient_quota"
# A key's usage counters in its Redis hash (``usage_key``), in this order everywhere.
USAGE_FIELDS = ("requests", "prompt_tokens", "cached_tokens", "completion_tokens")
RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"


def key_prefix(key_hash: str) -> str:
    """The Redis key prefix of one API key's counters (one hash tag: one cluster slot)."""
    return f"meridian:kl:{{{key_hash}}}:"


def usage_key(key_hash: str) -> str:
    """The Redis hash of a key's usage since it was issued (``USAGE_FIELDS``)."""
    return key_prefix(key_hash) + "u"


class Verdict(IntEnum):
    """The admission script's first reply value (and ``decide``'s)."""

    ADMITTED = 0
    CONCURRENCY = 1
    REQUESTS = 2
    TOKENS = 3
    BUDGET = 4


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """One key's limits; ``None`` is no limit.  Bad values raise ``ValueError``."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent: int | None = None
    token_budget: int | None = None
    budget_period: str = DEFAULT_BUDGET_PERIOD
    allowed_models: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        for name in ("requests_per_minute", "tokens_per_minute", "max_concurrent", "token_budget"):
            check_limit(name, getattr(self, name))
        if self.budget_period not in BUDGET_PERIODS:
            raise ValueError(
                f"budget_period must be one of {', '.join(BUDGET_PERIODS)}; "
                f"got {self.budget_period!r}"
            )
        for model in self.allowed_models:
            if not isinstance(model, str) or not model.strip() or model != model.strip():
                raise ValueError(f"allowed model names must be non-empty names; got {model!r}")

    @property
    def counted(self) -> bool:
        """Whether admission needs the shared counters (any numeric limit set)."""
        return any(
            v is not None
            for v in (
                self.requests_per_minute,
                self.tokens_per_minute,
                self.max_concurrent,
                self.token_budget,
            )
        )

    @property
    def budget_period_s(self) -> int:
        return BUDGET_PERIODS[self.budget_period]

    def allows(self, requested: str, base_model: str) -> bool:
        """A key with an allow-list may use a listed model or an adapter of one."""
        return not self.allowed_models or bool({requested, base_model} & self.allowed_models)


def check_limit(name: str, value: object) -> None:
    """``value`` is None or a whole number in [1, MAX_LIMIT]; else ``ValueError``."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be a whole number or empty; got {value!r}")
    if not 1 <= value <= MAX_LIMIT:
        raise ValueError(f"{name} must be between 1 and {MAX_LIMIT} (empty: no limit); got {value}")


def parse_limit(name: str, text: str | None) -> int | None:
    """A limit as an operator types it: empty or ``none`` for no limit, else a whole
    number (``1_000`` and ``1000`` alike)."""
    if text is None or text.strip().lower() in ("", "none"):
        return None
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"{name} must be a whole number or 'none'; got {text!r}") from None
    check_limit(name, value)
    return value


NO_LIMITS = KeyLimits()


def parse_models(text: str | Iterable[str] | None) -> frozenset[str]:
    """A comma-separated allow-list (or a list of names); empty: every model."""
    if text is None:
        return frozenset()
    names = text.split(",") if isinstance(text, str) else list(text)
    models = set()
    for name in names:
        if not isinstance(name, str):
            raise ValueError(f"allowed model names must be strings; got {name!r}")
        if name.strip():
            models.add(name.strip())
    return frozenset(models)


def reservation(prompt_tokens: int, max_tokens: int | None) -> int:
    """Tokens held at admission: the prompt plus the completion's cap (or an estimate)."""
    completion = max_tokens if max_tokens is not None and max_tokens >= 0 else None
    return max(0, prompt_tokens) + (
        DEFAULT_COMPLETION_ESTIMATE if completion is None else completion
    )


@dataclass(frozen=True, slots=True)
class Counts:
    """A key's counters as admission found them (before this request)."""

    requests: int = 0  # in this minute
    tokens: int = 0  # in this minute
    concurrent: int = 0
    budget: int = 0  # in this budget period


def decide(limits: KeyLimits, counts: Counts, reserve: int) -> Verdict:
    """Admit or say which limit refuses.  The order (concurrency, requests, tokens,
    budget) is the Lua script's, so both stores refuse with the same reason."""
    if limits.max_concurrent is not None and counts.concurrent >= limits.max_concurrent:
        return Verdict.CONCURRENCY
    if limits.requests_per_minute is not None and counts.requests + 1 > limits.requests_per_minute:
        return Verdict.REQUESTS
    if limits.tokens_per_minute is not None and counts.tokens + reserve > limits.tokens_per_minute:
        return Verdict.TOKENS
    if limits.token_budget is not None and counts.budget + reserve > limits.token_budget:
        return Verdict.BUDGET
    return Verdict.ADMITTED


@dataclass(frozen=True, slots=True)
class Admission:
    """The outcome of one admission: verdict, the counters after it, and when they reset."""

    verdict: Verdict
    limits: KeyLimits
    counts: Counts  # after admission (unchanged when refused)
    reserve: int
    window_reset_ms: int  # until the minute window ends
    budget_reset_ms: int  # until the budget period ends
    now_ms: int = 0  # the store's clock at admission (which window and period it took)

    @property
    def admitted(self) -> bool:
        return self.verdict is Verdict.ADMITTED


def reset_ms(now_ms: int, period_ms: int) -> int:
    """Milliseconds from ``now_ms`` to the end of its fixed period."""
    return (now_ms // period_ms + 1) * period_ms - now_ms


def admission_from_reply(limits: KeyLimits, reserve: int, reply: list[int]) -> Admission:
    """The admission script's reply ``[verdict, requests, tokens, concurrent, budget,
    now_ms]`` as an ``Admission``; a malformed reply raises ``ValueError``."""
    if len(reply) != 6:
        raise ValueError(f"admission reply has {len(reply)} values, not 6: {reply!r}")
    verdict, requests, tokens, concurrent, budget, now_ms = (int(v) for v in reply)
    return Admission(
        Verdict(verdict),
        limits,
        Counts(requests, tokens, concurrent, budget),
        reserve,
        reset_ms(now_ms, WINDOW_MS),
        reset_ms(now_ms, limits.budget_period_s * 1000),
        now_ms,
    )


def duration(ms: int) -> str:
    """A reset time as OpenAI writes it (Go's duration style): ``20ms``, ``1.5s``, ``6m0s``."""
    ms = max(0, ms)
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds = f"{rest / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{seconds}"
    if minutes:
        return f"{minutes}m{seconds}"
    return seconds


def rate_limit_headers(admission: Admission) -> dict[str, str]:
    """OpenAI's ``x-ratelimit-*`` headers for the per-minute limits the key has."""
    limits, counts = admission.limits, admission.counts
    reset = duration(admission.window_reset_ms)
    headers: dict[str, str] = {}
    if limits.requests_per_minute is not None:
        headers["x-ratelimit-limit-requests"] = str(limits.requests_per_minute)
        headers["x-ratelimit-remaining-requests"] = str(
            max(0, limits.requests_per_minute - counts.requests)
        )
        headers["x-ratelimit-reset-requests"] = reset
    if limits.tokens_per_minute is not None:
        headers["x-ratelimit-limit-tokens"] = str(limits.tokens_per_minute)
        headers["x-ratelimit-remaining-tokens"] = str(
            max(0, limits.tokens_per_minute - counts.tokens)
        )
        headers["x-ratelimit-reset-tokens"] = reset
    return headers


def refusal(admission: Admission) -> ApiError:
    """The 429 of a refused admission, with its headers and ``retry-after``."""
    limits, counts, verdict = admission.limits, admission.counts, admission.verdict
    retry_ms = admission.window_reset_ms
    code = RATE_LIMIT_EXCEEDED
    if verdict is Verdict.CONCURRENCY:
        message = (
            f"Too many concurrent requests for this API key: limit {limits.max_concurrent}, "
            f"in flight {counts.concurrent}. Retry when one finishes."
        )
        retry_ms = 1000
    elif verdict is Verdict.REQUESTS:
        message = (
            f"Rate limit reached for requests per minute: limit {limits.requests_per_minute}, "
            f"used {counts.requests}. Please try again in {duration(retry_ms)}."
        )
    elif verdict is Verdict.TOKENS:
        message = (
            f"Rate limit reached for tokens per minute: limit {limits.tokens_per_minute}, "
            f"used {counts.tokens}, requested {admission.reserve}. "
            f"Please try again in {duration(retry_ms)}."
        )
        if limits.tokens_per_minute is not None and admission.reserve > limits.tokens_per_minute:
            message += " This request alone exceeds the limit; lower max_tokens or the prompt."
    elif verdict is Verdict.BUDGET:
        code = INSUFFICIENT_QUOTA
        retry_ms = admission.budget_reset_ms
        message = (
            f"You exceeded your current quota: {limits.token_budget} tokens per "
            f"{limits.budget_period}, used {counts.budget}, requested {admission.reserve}. "
            f"The budget renews in {duration(retry_ms)}."
        )
    else:
        raise ValueError("an admitted request is no refusal")
    headers = rate_limit_headers(admission)
    headers["Retry-After"] = str(max(1, math.ceil(retry_ms / 1000)))
    return ApiError(429, message, type=code, code=code, headers=headers)


def model_not_allowed(model: str) -> ApiError:
    """A model the key may not use: the very 404 of an unknown model (OpenAI's answer to
    a model the caller has no access to), so a key learns nothing of models beyond it."""
    return ApiError(
        404,
        f"The model `{model}` does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )


# -- the process-local fallback --------------------------------------------------------


@dataclass
class _KeyCounters:
    window: int = -1
    requests: int = 0
    tokens: int = 0
    period: int = -1
    budget: int = 0
    in_flight: set[str] = field(default_factory=set)


@dataclass
class LocalLedger:
    """The same counters in this process's memory, for while Redis is unreachable.

    Limits then hold per process (N processes admit up to N times a limit): degraded,
    never failing.  At most ``max_keys`` keys are held; the least recent goes first."""

    max_keys: int = 4096
    _keys: dict[str, _KeyCounters] = field(default_factory=dict)

    def admit(
        self, key: str, limits: KeyLimits, reserve: int, member: str, now_ms: int
    ) -> Admission:
        counters = self._keys.pop(key, None) or _KeyCounters()
        self._keys[key] = counters  # most recent last
        while len(self._keys) > self.max_keys:
            del self._keys[next(iter(self._keys))]
        window = now_ms // WINDOW_MS
        if counters.window != window:
            counters.window, counters.requests, counters.tokens = window, 0, 0
        period_ms = limits.budget_period_s * 1000
        if counters.period != now_ms // period_ms:
            counters.period, counters.budget = now_ms // period_ms, 0
        before = Counts(
            counters.requests, counters.tokens, len(counters.in_flight), counters.budget
        )
        verdict = decide(limits, before, reserve)
        if verdict is Verdict.ADMITTED:
            counters.requests += 1
            counters.tokens += reserve
            counters.budget += reserve
            counters.in_flight.add(member)
        after = Counts(counters.requests, counters.tokens, len(counters.in_flight), counters.budget)
        return Admission(
            verdict,
            limits,
            after,
            reserve,
            reset_ms(now_ms, WINDOW_MS),
            reset_ms(now_ms, period_ms),
            now_ms,
        )

    def finish(self, key: str, member: str, reserved: int, actual: int | None) -> None:
        counters = self._keys.get(key)
        if counters is None:
            return
        if member in counters.in_flight:
            counters.in_flight.discard(member)
            if actual is not None:
                counters.tokens = max(0, counters.tokens + actual - reserved)
                counters.budget = max(0, counters.budget + actual - reserved)
