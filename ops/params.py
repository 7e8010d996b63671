"""``--param key=value`` for the commands that build policies (``simulate``, ``bench routing``)."""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_param_argument(parser: argparse.ArgumentParser, help: str) -> None:
    """``--param KEY=VALUE``, repeatable, into ``options["param"]`` as (key, value) pairs."""
    parser.add_argument(
        "--param", action="append", default=[], type=policy_param, metavar="KEY=VALUE", help=help
    )


def policy_param(raw: str) -> tuple[str, Any]:
    """``key=value``, the value read as JSON when it parses (numbers, booleans), else
    as a string; an argparse ``type``."""
    key, sep, value = raw.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {raw!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value
