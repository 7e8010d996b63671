"""`manage.py bench <benchmark>`: run one of Meridian's benchmarks and print its table.

    manage.py bench routing ...        # routing policies (ops.bench.routing)
    manage.py bench proxy --server both --concurrency 1,32,128 --json var/proxy.json
    manage.py bench predictor --trace conversations.jsonl   # response-length prediction
    manage.py bench key_limits --requests 5000 --processes 2   # per-key limit admission
    manage.py bench forecaster --servegen DIR --azure CSV   # workload forecast APE

Each benchmark is a module ``ops.bench.<name>`` with ``add_arguments(parser)``
and ``run(options, stdout)``; this command only builds one argparse subparser per
module and hands the parsed options over.  A benchmark module that is not in
this checkout is not offered (``find_spec``), so the others still run.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

BENCHMARKS = (
    "routing",
    "proxy",
    "sim",
    "predictor",
    "key_limits",
    "forecaster",
    "placement",
    "scaleout",
)


def _module(name: str) -> ModuleType:
    return importlib.import_module(f"ops.bench.{name}")


def available() -> list[str]:
    return [name for name in BENCHMARKS if importlib.util.find_spec(f"ops.bench.{name}")]


class Command(BaseCommand):
    help = "Run a benchmark: routing policies or the proxy's own overhead."

    def add_arguments(self, parser: CommandParser) -> None:
        subparsers = parser.add_subparsers(dest="benchmark", required=True)
        for name in available():
            module = _module(name)
            sub = subparsers.add_parser(name, help=(module.__doc__ or "").split("\n")[0])
            module.add_arguments(sub)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            _module(options["benchmark"]).run(options, self.stdout)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        except KeyboardInterrupt:
            raise CommandError("interrupted; every process the benchmark started is stopped")
