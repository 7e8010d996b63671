"""A schema-shaped JSON value for a JSON Schema: what the emulated model "writes".

vLLM answers ``response_format: json_schema`` and forced tool calls by guided
decoding: a grammar compiled from the schema lets the model emit only tokens
that keep the output valid.  The emulated model has no logits to mask, so it
writes one valid instance directly:

* every property the object declares, in declaration order (required or not),
  and no others;
* ``const``, else the first ``enum`` value, else ``default``;
* the first alternative of ``anyOf``/``oneOf``, the merge of ``allOf``, the
  first non-null type of a type list, ``$ref`` into ``$defs``/``definitions``;
* strings are words of the emulated vocabulary (``words``), padded or cut to
  ``minLength``/``maxLength``; common ``format`` values get a fixed valid
  example; integers are 1 and numbers 1.5, moved into their bounds; booleans
  are true; arrays hold ``minItems`` items (at least one, at most ``maxItems``).

Keywords it cannot honour (``pattern``, ``not``, conditionals, ``multipleOf``,
``uniqueItems``, ``minProperties``, ``contains``...) raise ``SchemaError``, which
the replica answers with a 400 rather than emitting JSON the schema rejects.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping
from typing import Any

MAX_DEPTH = 12

_UNSUPPORTED = (
    "pattern",
    "patternProperties",
    "not",
    "if",
    "then",
    "else",
    "multipleOf",
    "uniqueItems",
    "minProperties",
    "contains",
    "dependentRequired",
    "dependentSchemas",
)
_FORMATS = {
    "date": "2024-01-01",
    "date-time": "2024-01-01T00:00:00Z",
    "time": "00:00:00",
    "email": "user@example.com",
    "uuid": "00000000-0000-4000-8000-000000000000",
    "uri": "https://example.com/",
    "hostname": "example.com",
    "ipv4": "192.0.2.1",
    "ipv6": "2001:db8::1",
}


class SchemaError(ValueError):
    """The schema asks for something the emulated model cannot produce."""


def instance(schema: Mapping[str, Any], words: Iterator[str]) -> Any:
    """A JSON value valid under ``schema``; strings take words from ``words``."""
    return _Writer(schema, words).value(schema, 0)


class _Writer:
    def __init__(self, root: Mapping[str, Any], words: Iterator[str]) -> None:
        self.root = root
        self.words = words

    def value(self, schema: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise SchemaError(f"the schema nests deeper than {MAX_DEPTH} levels")
        if schema is True or schema == {}:
            return self._string({})
        if not isinstance(schema, Mapping):
            raise SchemaError(f"a schema must be an object, got {schema!r}")
        for keyword in _UNSUPPORTED:
            if keyword in schema:
                raise SchemaError(f"the JSON schema keyword `{keyword}` is not supported")
        if "$ref" in schema:
            return self.value(self._resolve(schema["$ref"]), depth + 1)
        if "const" in schema:
            return schema["const"]
        if schema.get("enum"):
            return schema["enum"][0]
        if "default" in schema:
            return schema["default"]
        for combinator in ("anyOf", "oneOf"):
            if schema.get(combinator):
                return self.value(schema[combinator][0], depth + 1)
        if schema.get("allOf"):
            return self.value(_merge(schema), depth + 1)
        return self._typed(schema, _type_of(schema), depth)

    def _typed(self, schema: Mapping[str, Any], kind: str, depth: int) -> Any:
        match kind:
            case "object":
                properties = schema.get("properties") or {}
                return {name: self.value(sub, depth + 1) for name, sub in properties.items()}
            case "array":
                return self._array(schema, depth)
            case "string":
                return self._string(schema)
            case "integer" | "number":
                return _number(schema, kind)
            case "boolean":
                return True
            case "null":
                return None
        raise SchemaError(f"unknown JSON schema type `{kind}`")

    def _array(self, schema: Mapping[str, Any], depth: int) -> list[Any]:
        prefix = [self.value(sub, depth + 1) for sub in schema.get("prefixItems") or []]
        wanted = max(int(schema.get("minItems", 1)), len(prefix))
        if "maxItems" in schema:
            wanted = min(wanted, int(schema["maxItems"]))
        if len(prefix) >= wanted:
            return prefix[:wanted]
        items = schema.get("items", {})
        if items is False:
            raise SchemaError("`minItems` asks for more items than `prefixItems` allows")
        return prefix + [self.value(items, depth + 1) for _ in range(wanted - len(prefix))]

    def _string(self, schema: Mapping[str, Any]) -> str:
        text = _FORMATS.get(str(schema.get("format")), "")
        if not text:
            text = "".join(itertools.islice(self.words, 2)).strip()  # words lead with a space
        least, most = int(schema.get("minLength", 0)), schema.get("maxLength")
        while len(text) < least:
            text += next(self.words)
        return text if most is None else text[: int(most)]

    def _resolve(self, ref: Any) -> Any:
        if not isinstance(ref, str) or not ref.startswith("#/"):
            raise SchemaError(f"only local references (#/...) are supported, got {ref!r}")
        node: Any = self.root
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, Mapping) or part not in node:
                raise SchemaError(f"the reference {ref} points nowhere")
            node = node[part]
        return node


def _type_of(schema: Mapping[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"] or ["null"]
        kind = kinds[0]
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    if not isinstance(kind, str):
        raise SchemaError(f"`type` must be a string or a list of strings, got {kind!r}")
    return kind


def _merge(schema: Mapping[str, Any]) -> dict[str, Any]:
    """``allOf`` as one schema: later parts' keywords win, properties are united."""
    merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
    for part in schema["allOf"]:
        if not isinstance(part, Mapping):
            raise SchemaError("every `allOf` entry must be a schema object")
        properties = {**merged.get("properties", {}), **part.get("properties", {})}
        merged.update(part)
        if properties:
            merged["properties"] = properties
    return merged


def _number(schema: Mapping[str, Any], kind: str) -> int | float:
    """1 (integers) or 1.5 (numbers), moved inside the schema's bounds."""
    low = _bound(schema, "minimum", "exclusiveMinimum", +1)
    high = _bound(schema, "maximum", "exclusiveMaximum", -1)
    if kind == "integer":
        least = None if low is None else math.floor(low[0]) + 1 if low[1] else math.ceil(low[0])
        most = None if high is None else math.ceil(high[0]) - 1 if high[1] else math.floor(high[0])
        value = 1 if least is None else max(1, least)
        value = value if most is None else min(value, most)
        if least is not None and value < least:
            raise SchemaError("no integer lies between the schema's bounds")
        return value
    if low is not None and high is not None:
        if low[0] > high[0] or (low[0] == high[0] and (low[1] or high[1])):
            raise SchemaError("no number lies between the schema's bounds")
        return (low[0] + high[0]) / 2 if low[0] != high[0] else float(low[0])
    if low is not None:
        return low[0] + 1.5 if low[1] else max(1.5, float(low[0]))
    if high is not None:
        return high[0] - 1.5 if high[1] else min(1.5, float(high[0]))
    return 1.5


def _bound(schema: Mapping[str, Any], inclusive: str, exclusive: str, side: int) -> Any:
    """``(value, is_exclusive)`` of the tighter of a bound's two spellings, or None."""
    found = []
    if isinstance(schema.get(inclusive), int | float):
        found.append((schema[inclusive], False))
    if isinstance(schema.get(exclusive), int | float):
        found.append((schema[exclusive], True))
    if not found:
        return None
    # The tighter bound: the larger minimum, the smaller maximum (exclusive wins a tie).
    return max(found, key=lambda b: (b[0] * side, b[1]))
