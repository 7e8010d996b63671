"""``manage.py bench routing``: what a routing decision costs, per policy, and what state costs.

Three tables, all measured in this process on the very policy objects the balancer runs:

1. **Decision cost** — p50/p99 microseconds of one ``select`` (tokenization excluded;
   wall-clock, or this thread's CPU time with ``--cpu-time``)
   for prompts of 512, 4k and 32k tokens (32, 256 and 2048 block hashes) over 8, 64
   and 512 targets.  Stateful policies (``skylb``, ``sglang``, ``cache_map``) are first
   pre-loaded with ``--prefixes`` cached prefixes (100k by default: 1,000 shared
   system prompts of 8 blocks, each with 100 distinct 4-block continuations), and each
   measured prompt reuses three quarters of an earlier prompt, as a follow-up turn of a
   conversation does, so the match walks deep and the insert adds a fresh tail.  The
   preloading requests complete; the measured ones stay in flight.
2. **Tokenization + hashing** per 8k tokens (``WordTokenizer`` and 16-token chained
   block hashing), the per-request cost the balancer pays before any policy runs.
3. **Memory** per cached block and per 4k-token prefix (256 blocks, tracemalloc) of
   the prefix trie, the radix tree and the cache map, filled with ``--prefixes``
   16-block prefixes for 4 replicas; with the defaults that is past every bound, so
   the table shows size stopping at the bound.
4. **The whole decision** for a chat request of ~300, 4k and 32k tokens, fresh and
   as a conversation's follow-up turn: chat template + tokenize + hash + select,
   CPU time, with a model tokenizer and with the fallback (``ops.bench.prompt_cost``).
   With ``--against-sglang PATH``, the CPU per ~4k-token request of Meridian's
   balancer process beside sglang-router's (``ops.bench.against_sglang``).
5. **The prefix digest** a region reports to its peers: building it, its wire form
   both ways, and matching a 2,048-block prompt (``ops.bench.digest``).

Targets reported against (not asserted): decision p50 < 100 us for a 4k-token prompt,
tokenization + hashing < 1 ms per 8k tokens.  ``--quick`` runs small sizes for a smoke
test.  Timing claims live here, never in the test suite.
"""

from __future__ import annotations

import argparse
import gc
import random
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from core.blocks import block_hashes
from core.cache_map import CacheMap
from core.policy import CostModel, Policy
from core.prefix_trie import PrefixTrie
from core.radix_tree import RadixTree
from core.registry import build_policy, policy_defaults, policy_names
from core.tokenizer import WordTokenizer
from core.types import RequestDescriptor, TargetState
from ops.bench.against_sglang import compare, cpu_count_note
from ops.bench.digest import digest_table
from ops.bench.prompt_cost import chat_messages, model_encoder, prompt_cost_table, words_for
from ops.params import add_param_argument

DECISION_TARGET_US = 100.0
TOKENIZE_TARGET_US = 1000.0
PROMPT_TOKENS = (512, 4096, 32768)
BLOCK_TOKENS = 16


@dataclass(frozen=True, slots=True)
class Sizes:
    """How big a run is; ``--quick`` shrinks everything for a smoke test."""

    targets: tuple[int, ...]
    prefixes: int
    samples: int
    tokenize_runs: int
    memory_prefixes: int
    memory_scale: float  # fraction of each structure's default bound used in table 3
    decision_runs: int  # fresh chat requests per prompt size in table 4
    digest_turns: int  # conversation turns filling each tree of table 5


FULL = Sizes((8, 64, 512), 100_000, 1000, 30, 100_000, 1.0, 30, 20_000)
QUICK = Sizes((8, 64), 500, 20, 3, 1_000, 0.01, 2, 500)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--policies",
        type=lambda raw: [p.strip() for p in raw.split(",") if p.strip()],
        default=None,
        help=f"comma-separated policies (default all: {','.join(policy_names())})",
    )
    add_param_argument(
        parser,
        "a parameter of every policy measured, as ServiceConfig.policy_params "
        "(e.g. --policies meridian --param tree_from_kv_events=true)",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--seed", type=int, default=0, help="seed of every generated workload")
    parser.add_argument(
        "--prefixes", type=int, default=None, help="cached prefixes pre-loaded (default 100k)"
    )
    parser.add_argument(
        "--decision-runs",
        type=int,
        default=None,
        help="chat requests per row of the whole-decision table (default 30, --quick 2)",
    )
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time decisions in this thread's CPU time, not wall-clock time: on a shared "
        "machine a decision preempted by another process then counts only its own work "
        "(each reading costs about a microsecond more)",
    )
    parser.add_argument(
        "--against-sglang",
        metavar="PATH",
        default=None,
        help="also measure CPU per 4k-token request of Meridian's balancer and of "
        "sglang-router (PATH: its venv or executable, installed apart from Meridian)",
    )
    parser.add_argument(
        "--sglang-requests", type=int, default=200, help="requests per router (default 200)"
    )


def run(options: dict[str, Any], stdout: TextIO) -> None:
    sizes = QUICK if options.get("quick") else FULL
    if options.get("prefixes"):
        sizes = Sizes(**{**_fields(sizes), "prefixes": int(options["prefixes"])})
    if options.get("decision_runs"):
        sizes = Sizes(**{**_fields(sizes), "decision_runs": int(options["decision_runs"])})
    names = options.get("policies") or policy_names()
    unknown = sorted(set(names) - set(policy_names()))
    if unknown:
        raise ValueError(f"unknown policies: {', '.join(unknown)}")
    seed = int(options.get("seed") or 0)
    cpu_time = bool(options.get("cpu_time"))
    clock = time.thread_time_ns if cpu_time else time.perf_counter_ns
    kind = "thread CPU" if cpu_time else "wall-clock"
    stdout.write(
        f"decision cost per select, {kind} microseconds ({sizes.prefixes} cached prefixes)\n"
    )
    params = dict(options.get("param") or [])
    stdout.write(format_table(*decision_table(names, sizes, seed, clock, params)) + "\n")
    stdout.write("tokenization + block hashing, microseconds per 8k tokens\n")
    stdout.write(format_table(*tokenize_table(sizes, seed)) + "\n")
    stdout.write("memory of cached prefixes at the configured bounds (tracemalloc)\n")
    stdout.write(format_table(*memory_table(sizes, seed)) + "\n")
    stdout.write("whole decision per chat request, fresh and follow-up turn, CPU us (median)\n")
    headers, rows, _ = prompt_cost_table(sizes.decision_runs, seed)
    stdout.write(format_table(headers, rows) + "\n")
    stdout.write("prefix digest for peers, 4 replicas at their bounds, microseconds (median)\n")
    stdout.write(format_table(*digest_table(seed, sizes.tokenize_runs, sizes.digest_turns)))
    if options.get("against_sglang"):
        stdout.write("\n" + sglang_table(options, seed))


def sglang_table(options: dict[str, Any], seed: int) -> str:
    """CPU per request of each router for the same ~4k-token chat prompt."""
    requests = int(options.get("sglang_requests") or 200)
    rng = random.Random(f"sglang-{seed}")
    with tempfile.TemporaryDirectory(prefix="meridian-bench-model-") as tmp:
        model = model_encoder(Path(tmp))
        messages = chat_messages(words_for(model, 4096, rng), rng)
        text = messages[0]["content"] + " " + messages[1]["content"]
        costs = compare(str(options["against_sglang"]), text, requests, Path(tmp))
    headers = ["router", "requests", "CPU ms/request", "raw CPU ms/request"]
    rows = [[c.router, str(c.requests), f"{c.cpu_ms_per_request:.3f}",
             f"{c.raw_cpu_ms_per_request:.3f}"] for c in costs]  # fmt: skip
    return (
        f"CPU per ~4k-token chat request, same prompt each time ({cpu_count_note()})\n"
        + format_table(headers, rows)
    )


def _fields(sizes: Sizes) -> dict[str, Any]:
    return {name: getattr(sizes, name) for name in Sizes.__slots__}


# -- workload ---------------------------------------------------------------------------


class Workload:
    """Deterministic synthetic block-hash prompts: shared system prompts and follow-ups."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self._count = 0

    def fresh(self, n: int) -> list[int]:
        return [self.rng.getrandbits(64) for _ in range(n)]

    def prefixes(self, count: int, shared: int = 8, own: int = 4) -> list[list[int]]:
        """``count`` prefixes: groups of 100 share an 8-block system prompt."""
        out: list[list[int]] = []
        system = self.fresh(shared)
        for i in range(count):
            if i % 100 == 0:
                system = self.fresh(shared)
            out.append(system + self.fresh(own))
        return out

    def request(self, blocks: Sequence[int], session: str = "") -> RequestDescriptor:
        self._count += 1
        return RequestDescriptor(
            request_id=f"bench-{self._count}",
            model="bench",
            prompt_tokens=len(blocks) * BLOCK_TOKENS,
            block_hashes=tuple(blocks),
            session_key=session or f"user-{self.rng.randrange(10_000)}",
        )


def make_targets(n: int, rng: random.Random) -> list[TargetState]:
    return [
        TargetState(
            target_id=f"replica-{i:03d}",
            url=f"http://replica-{i}.bench",
            outstanding=rng.randrange(8),
            waiting=rng.randrange(3),
            kv_usage=rng.random(),
            extra={"rtt_ms": float(rng.randrange(5, 200))},
        )
        for i in range(n)
    ]


def preload(policy: Policy, work: Workload, targets: list[TargetState], count: int) -> None:
    """Route ``count`` prefixes; a cache map also hears the replicas' BlockStored events.

    Each preloading request then completes: the prefixes are cached because the
    requests that brought them finished.  Without it a policy that keeps a ledger
    of in-flight work (``meridian``) would be measured on 100k requests still
    queued (about 20 s of prefill queued on every one of 512 replicas), a state
    no balancer reaches."""
    # A cache map, or a meridian tree kept by KV events (tree_from_kv_events), hears
    # of every stored prefix as the engines would tell it.
    sink = policy.kv_sink
    for blocks in work.prefixes(count):
        request = work.request(blocks)
        chosen = policy.select(request, targets)
        if chosen is None:
            continue
        if sink is not None:
            sink.apply_stored(chosen.target_id, blocks)
        policy.on_complete(request, chosen, ok=True)


# -- table 1: decisions -------------------------------------------------------------------


def percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def time_selects(
    policy: Policy,
    work: Workload,
    targets: list[TargetState],
    blocks: int,
    samples: int,
    clock: Callable[[], int] = time.perf_counter_ns,
) -> list[float]:
    """Microseconds per select for follow-up prompts reusing 3/4 of an earlier prompt."""
    bases = [work.fresh(blocks) for _ in range(16)]
    for base in bases:
        policy.select(work.request(base), targets)
    reused = blocks * 3 // 4
    requests = [
        work.request(bases[i % len(bases)][:reused] + work.fresh(blocks - reused))
        for i in range(samples)
    ]
    gc.collect()
    out: list[float] = []
    for req in requests:
        start = clock()
        policy.select(req, targets)
        out.append((clock() - start) / 1000.0)
    return out


def decision_table(
    names: Sequence[str],
    sizes: Sizes,
    seed: int,
    clock: Callable[[], int] = time.perf_counter_ns,
    params: Mapping[str, Any] | None = None,
) -> tuple[list[str], list[list[str]]]:
    headers = ["policy", "targets"]
    for tokens in PROMPT_TOKENS:
        label = f"{tokens // 1024}k" if tokens >= 1024 else str(tokens)
        headers += [f"{label} p50", f"{label} p99"]
    headers.append("4k p50<100us")
    rows: list[list[str]] = []
    for name in names:
        for n_targets in sizes.targets:
            row = decision_row(name, n_targets, sizes, seed, clock, params)
            rows.append([name, str(n_targets), *row])
    return headers, rows


def decision_row(
    name: str,
    n_targets: int,
    sizes: Sizes,
    seed: int,
    clock: Callable[[], int] = time.perf_counter_ns,
    params: Mapping[str, Any] | None = None,
) -> list[str]:
    work = Workload(seed)
    targets = make_targets(n_targets, work.rng)
    policy = build_policy(name, params)
    policy.on_targets_changed([t.target_id for t in targets])
    if isinstance(policy, CostModel):
        # As the router does with each probe it records: a cost model hears KV usage.
        for target in targets:
            policy.observe_probe(target.target_id, target.kv_usage)
    preload(policy, work, targets, sizes.prefixes)
    cells: list[str] = []
    verdict = "-"
    for tokens in PROMPT_TOKENS:
        blocks = tokens // BLOCK_TOKENS
        samples = time_selects(policy, work, targets, blocks, sizes.samples, clock)
        p50, p99 = percentile(samples, 0.5), percentile(samples, 0.99)
        cells += [f"{p50:.1f}", f"{p99:.1f}"]
        if tokens == 4096:
            verdict = "ok" if p50 < DECISION_TARGET_US else "MISS"
    return [*cells, verdict]


# -- table 2: tokenization and hashing ------------------------------------------------------


def synthetic_text(tokens: int, rng: random.Random) -> str:
    """Text the word tokenizer splits into exactly ``tokens`` tokens (one per word)."""
    vocab = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randrange(2, 10)))
             for _ in range(5000)]  # fmt: skip
    return "".join(" " + rng.choice(vocab) for _ in range(tokens))


def tokenize_table(sizes: Sizes, seed: int) -> tuple[list[str], list[list[str]]]:
    tokenizer = WordTokenizer()
    text = synthetic_text(8192, random.Random(seed))
    tokens = tokenizer.encode(text)
    encode = _median_us(lambda: tokenizer.encode(text), sizes.tokenize_runs)
    hashing = _median_us(lambda: block_hashes(tokens), sizes.tokenize_runs)
    total = encode + hashing
    verdict = "ok" if total < TOKENIZE_TARGET_US else "MISS"
    headers = ["tokens", "tokenize", "hash", "total", "target", "<1ms"]
    return headers, [[str(len(tokens)), f"{encode:.0f}", f"{hashing:.0f}", f"{total:.0f}",
                      f"{TOKENIZE_TARGET_US:.0f}", verdict]]  # fmt: skip


def _median_us(fn: Callable[[], object], runs: int) -> float:
    fn()  # warm caches (the tokenizer's piece-id cache, as in a long-running balancer)
    samples = []
    for _ in range(runs):
        start = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - start) / 1000.0)
    return percentile(samples, 0.5)


# -- table 3: memory ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Structure:
    name: str
    bound_blocks: int
    fill: Callable[[list[list[int]], list[str]], Callable[[], int]]


def structures(scale: float) -> list[Structure]:
    """The three prefix structures at their policies' default bounds (times ``scale``)."""
    trie_max = max(1, int(policy_defaults("skylb")["max_nodes"] * scale))
    radix_max = max(1, int(policy_defaults("sglang")["max_blocks_per_target"] * scale))
    map_max = max(1, int(policy_defaults("cache_map")["max_blocks_per_replica"] * scale))

    def trie(prefixes: list[list[int]], ids: list[str]) -> Callable[[], int]:
        t = PrefixTrie(trie_max)
        for i, p in enumerate(prefixes):
            t.insert(p, ids[i % len(ids)])
        return lambda: len(t)

    def radix(prefixes: list[list[int]], ids: list[str]) -> Callable[[], int]:
        r = RadixTree(radix_max)
        for i, p in enumerate(prefixes):
            r.insert(p, ids[i % len(ids)])
        return lambda: sum(r.size(x) for x in ids)

    def cache_map(prefixes: list[list[int]], ids: list[str]) -> Callable[[], int]:
        m = CacheMap(max_blocks_per_replica=map_max, speculative_ttl_s=30.0, max_speculative=1)
        for i, p in enumerate(prefixes):
            m.apply_stored(ids[i % len(ids)], p)
        return lambda: len(m)

    return [
        Structure("skylb trie", trie_max, trie),
        Structure("sglang radix", radix_max, radix),
        Structure("cache map", map_max, cache_map),
    ]


MEMORY_TARGETS = 4


def memory_table(sizes: Sizes, seed: int) -> tuple[list[str], list[list[str]]]:
    ids = [f"replica-{i}" for i in range(MEMORY_TARGETS)]
    headers = ["structure", "bound", "blocks held", "MiB", "B/block", "KiB/4k prefix", "bounded"]
    rows = []
    for structure in structures(sizes.memory_scale):
        # Bounds are per structure (trie) or per replica (radix tree, cache map).
        bound = structure.bound_blocks * (1 if structure.name == "skylb trie" else len(ids))
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        # Generated inside the trace so the hash ints the structure keeps are counted;
        # the lists themselves are freed before the measurement.
        prefixes = Workload(seed).prefixes(sizes.memory_prefixes, shared=8, own=8)
        held = structure.fill(prefixes, ids)
        del prefixes
        gc.collect()
        used = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        blocks = held()
        per_block = used / max(blocks, 1)
        rows.append([structure.name, str(bound), str(blocks), f"{used / 2**20:.1f}",
                     f"{per_block:.0f}", f"{per_block * 256 / 1024:.1f}",
                     "yes" if blocks <= bound else "NO"])  # fmt: skip
    return headers, rows


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """One aligned plain-text table: first column left-aligned, numbers right-aligned."""
    cells = [list(headers), *[list(r) for r in rows]]
    widths = [max(len(line[i]) for line in cells) for i in range(len(headers))]

    def line(values: list[str]) -> str:
        first = values[0].ljust(widths[0])
        rest = (v.rjust(w) for v, w in zip(values[1:], widths[1:], strict=True))
        return "  ".join([first, *rest]).rstrip()

    return "\n".join(line(v) for v in cells) + "\n"
