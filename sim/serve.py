"""Serve one or more emulated vLLM replicas from one process, each on its own port.

    python -m sim.serve --replica us-a=8101 --replica us-b=8102 \\
        --model meridian-demo --profile l4-llama3.1-8b --time-scale 0.05 \\
        --num-blocks 2048 --max-num-seqs 64 --max-num-batched-tokens 2048 \\
        --host 127.0.0.1 [--block-size 16] [--kv-events-port-base 5557] \\
        [--kv-events-replay-port-base 5657] [--kv-events-host '*'] \\
        [--tokenizer-json PATH | --tokenizer DIR] [--fault us-b=slow] [--lora NAME ...] \\
        [--max-loras 4] [--runner generate|pooling] [--embedding-size 384] [--max-logprobs 20] \\
        [--tool-call-parser NAME] [--enable-auto-tool-choice] [--scheduling-policy priority]

Each replica is its own ``Engine`` behind its own uvicorn server; they share
one event loop (the demo runs nine of them on two cores, and an idle engine
only waits on an event).  With ``--kv-events-port-base N`` replica *i* (in
command-line order) publishes KV events on ``tcp://*:N+i`` and, with
``--kv-events-replay-port-base M``, answers replay requests on ``tcp://*:M+i``.
``--kv-events-host 127.0.0.1`` writes the endpoint with that host instead, which,
as in vLLM, makes the publisher connect rather than bind (the setup trap, for
tests of the balancer's warning).  SIGTERM or
SIGINT stops every server and exits 0.  ``--tokenizer DIR`` (vLLM's flag: a
directory with ``tokenizer.json``, ``tokenizer_config.json`` and optionally
``chat_template.jinja``) renders chat with the model's chat template and
tokenizes chat and completions with the model's tokenizer, so usage and
``cached_tokens`` count the model's tokens (``sim.engine.model_text``); without
it, Meridian's fixed template and ``--tokenizer-json`` or the word tokenizer.
``--lora NAME`` serves an emulated LoRA
adapter: requests naming it as their model hash their blocks with the adapter
name as the extra key (so they share cache only with the same adapter), and
their KV events carry its id.

The ``die`` fault makes a replica vanish as if its process had died: when it is
alone in the process the process exits at once (``os._exit``), otherwise its
listening socket is closed and its open connections are reset, leaving its
neighbours serving.

The last flags are vLLM's own: ``--runner pooling`` serves an embedding model
(``/v1/embeddings``, and no generation routes); ``--tool-call-parser`` (any
name: the emulated model writes its tool calls directly) lets requests force a
tool call, and ``--enable-auto-tool-choice`` lets it choose one under
``tool_choice: "auto"``; without them tool requests get vLLM's 400s.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import uvicorn

from core.block_identity import VLLM_DEFAULT_SEED, HashAlgo
from core.model_tokenizer import ModelTokenizer, TokenizerFilesError, tokenizer_files
from core.tokenizer import Tokenizer, build_tokenizer
from sim.engine import Engine, EngineConfig, Vocabulary, pooling
from sim.engine.logprobs import DEFAULT_MAX_LOGPROBS
from sim.engine.model_text import ModelText, model_words
from sim.engine.openai_protocol import ServerOptions
from sim.engine.profiles import PROFILES
from sim.engine.schedule_policy import SchedulePolicy
from sim.engine.structured import ToolSupport
from sim.kv_events import KVEventPublisher
from sim.replica import FAULT_MODES, Replica

logger = logging.getLogger("sim.serve")
DIE_EXIT_CODE = 137  # what a SIGKILLed process reports, which is what "die" imitates


class _QuietServer(uvicorn.Server):
    """A uvicorn server that leaves signal handling to this module (one handler for all)."""

    def capture_signals(self) -> Any:
        import contextlib

        return contextlib.nullcontext()


@dataclass(frozen=True)
class ReplicaSpec:
    name: str
    port: int


def _name_value(text: str, what: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name or not value:
        raise argparse.ArgumentTypeError(f"{what} must look like NAME=VALUE, got {text!r}")
    return name, value


def _replica_spec(text: str) -> ReplicaSpec:
    name, port = _name_value(text, "--replica")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"bad port in --replica {text!r}")
    return ReplicaSpec(name, int(port))


def _fault_spec(text: str) -> tuple[str, str]:
    name, mode = _name_value(text, "--fault")
    if mode not in FAULT_MODES:
        raise argparse.ArgumentTypeError(f"--fault mode must be one of {FAULT_MODES}")
    return name, mode


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sim.serve", description=__doc__.split("\n")[0])
    p.add_argument(
        "--replica",
        type=_replica_spec,
        action="append",
        required=True,
        metavar="NAME=PORT",
        help="a replica to serve (repeatable)",
    )
    p.add_argument("--model", default="meridian-demo", help="served model name")
    p.add_argument("--profile", default="l4-llama3.1-8b", choices=sorted(PROFILES))
    p.add_argument(
        "--time-scale",
        type=_positive_float,
        default=0.05,
        help="wall seconds per modeled second (0.05 = 20x faster than the GPU)",
    )
    # The engine's shape defaults to the profile's (sim.engine.profiles); each overrides it.
    p.add_argument("--num-blocks", "--kv-blocks", type=int, default=None, help="KV blocks")
    p.add_argument("--kv-tokens", type=int, default=None, help="KV cache size in tokens")
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=None, help="context limit in tokens")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    p.add_argument(
        "--prefix-caching-hash-algo",
        choices=[a.value for a in HashAlgo],
        default=HashAlgo.SHA256.value,
        help="vLLM's block hash algorithm",
    )
    p.add_argument(
        "--hash-seed",
        default=VLLM_DEFAULT_SEED,
        help="vLLM's none-hash seed (what PYTHONHASHSEED sets for a real vLLM)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the output-length model")
    p.add_argument("--kv-events-port-base", type=int, default=None)
    p.add_argument("--kv-events-replay-port-base", type=int, default=None)
    p.add_argument("--kv-events-host", default="*", help="'*' binds; a host connects (vLLM)")
    p.add_argument("--tokenizer-json", default=None)
    p.add_argument(
        "--tokenizer",
        default=None,
        metavar="DIR",
        help="the model's tokenizer files (Hugging Face layout), as vLLM's --tokenizer: "
        "chat and completions are rendered and tokenized with them",
    )
    p.add_argument(
        "--lora",
        action="append",
        default=[],
        metavar="NAME",
        help="serve an emulated LoRA adapter under this model name (repeatable)",
    )
    p.add_argument("--max-loras", type=int, default=4)
    p.add_argument(
        "--scheduling-policy",
        choices=[SchedulePolicy.FCFS.value, SchedulePolicy.PRIORITY.value],
        default=SchedulePolicy.FCFS.value,
        help="vLLM's waiting order: fcfs, or priority (each request's `priority` first)",
    )
    p.add_argument("--runner", choices=("generate", "pooling"), default="generate")
    p.add_argument("--embedding-size", type=int, default=pooling.DEFAULT_EMBEDDING_SIZE)
    p.add_argument("--max-logprobs", type=int, default=DEFAULT_MAX_LOGPROBS)
    p.add_argument("--tool-call-parser", default=None, metavar="NAME")
    p.add_argument("--enable-auto-tool-choice", action="store_true")
    p.add_argument(
        "--fault",
        type=_fault_spec,
        action="append",
        default=[],
        metavar="NAME=MODE",
        help="start a replica in a fault mode (repeatable)",
    )
    return p  # fmt: skip


def build_replicas(args: argparse.Namespace) -> list[Replica]:
    """One engine + replica app per ``--replica``, sharing tokenizer and vocabulary."""
    if args.tokenizer and args.tokenizer_json:
        raise SystemExit("--tokenizer and --tokenizer-json are exclusive")
    encoder = model_tokenizer(args.tokenizer) if args.tokenizer else None
    tokenizer: Tokenizer = ModelText(encoder) if encoder else build_tokenizer(args.tokenizer_json)
    vocab = Vocabulary(tokenizer, extra_words=model_words(encoder) if encoder else ())
    try:
        config = EngineConfig.for_profile(
            args.profile,
            kv_blocks=args.num_blocks,
            kv_tokens=args.kv_tokens,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_model_len=args.max_model_len,
            block_size=args.block_size,
            hash_algo=HashAlgo(args.prefix_caching_hash_algo),
            hash_seed=args.hash_seed,
            seed=args.seed,
            max_loras=args.max_loras,
            schedule_policy=SchedulePolicy(args.scheduling_policy),
        )
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    # vLLM numbers adapters from 1 in the order they were registered.
    loras = {name: index for index, name in enumerate(args.lora, start=1)}
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        raise SystemExit("--enable-auto-tool-choice requires --tool-call-parser (as in vLLM)")
    server = ServerOptions(
        tools=ToolSupport(args.tool_call_parser, args.enable_auto_tool_choice),
        max_logprobs=args.max_logprobs,
    )
    replicas = []
    for index, spec in enumerate(args.replica):
        replicas.append(
            Replica(
                spec.name,
                engine=Engine(config, vocab),
                model=args.model,
                tokenizer=tokenizer,
                time_scale=args.time_scale,
                publisher=_publisher(args, index),
                loras=loras,
                runner=args.runner,
                server=server,
                embedding_size=args.embedding_size,
                encoder=encoder,
            )
        )
    return replicas


def model_tokenizer(directory: str) -> ModelTokenizer:
    """vLLM's ``--tokenizer DIR``: the model's files, read as the balancer reads them."""
    root = Path(directory)
    if not root.is_dir():
        raise SystemExit(f"--tokenizer {directory}: not a directory")

    def read(name: str) -> str | None:
        path = root / name
        return path.read_text(encoding="utf-8") if path.is_file() else None

    try:
        return ModelTokenizer(tokenizer_files(directory, read), now=datetime.now)
    except TokenizerFilesError as exc:
        raise SystemExit(f"--tokenizer {exc}") from None


def _publisher(args: argparse.Namespace, index: int) -> KVEventPublisher | None:
    """Replica ``index``'s KV-event publisher, written the way vLLM's config is."""
    if args.kv_events_port_base is None:
        return None
    endpoint = f"tcp://{args.kv_events_host}:{args.kv_events_port_base + index}"
    replay = None
    if args.kv_events_replay_port_base is not None:
        replay = f"tcp://*:{args.kv_events_replay_port_base + index}"
    return KVEventPublisher(endpoint, replay_endpoint=replay)


def _make_server(replica: Replica, host: str, port: int) -> _QuietServer:
    config = uvicorn.Config(
        replica,
        host=host,
        port=port,
        lifespan="off",
        http="httptools",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=2,
    )
    return _QuietServer(config)


def _vanish(server: uvicorn.Server) -> None:
    """Close the listening socket and reset every open connection, like a dead process."""
    for listener in getattr(server, "servers", []):
        listener.close()
    for connection in list(server.server_state.connections):
        transport = getattr(connection, "transport", None)
        if transport is not None:
            transport.abort()
    server.should_exit = True


async def serve(args: argparse.Namespace) -> None:
    replicas = build_replicas(args)
    servers = [
        _make_server(r, args.host, spec.port)
        for r, spec in zip(replicas, args.replica, strict=True)
    ]
    alone = len(replicas) == 1
    for replica, server in zip(replicas, servers, strict=True):
        replica.on_die = (lambda: os._exit(DIE_EXIT_CODE)) if alone else _bind(_vanish, server)
        replica.driver.start()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _stop_all, servers)
    faults = dict(args.fault)
    for replica in replicas:
        if replica.name in faults:
            replica.set_fault(faults[replica.name])
    try:
        await asyncio.gather(*(server.serve() for server in servers))
    finally:
        for replica in replicas:
            await replica.driver.stop()


def _bind(func: Any, *args: Any) -> Any:
    return lambda: func(*args)


def _stop_all(servers: Sequence[uvicorn.Server]) -> None:
    logger.info("stopping %d replica server(s)", len(servers))
    for server in servers:
        server.should_exit = True


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    unknown = {name for name, _ in args.fault} - {spec.name for spec in args.replica}
    if unknown:
        build_parser().error(f"--fault names unknown replica(s): {', '.join(sorted(unknown))}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
