"""The emulated model's structured output is valid under the schema it was asked for."""

from __future__ import annotations

import itertools
from typing import Any

import jsonschema
import pytest

from sim.engine.json_schema import SchemaError, instance

WORDS = [" kalo", " mine", " ruta", " sovi"]

SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}},
    {
        "type": "object",
        "properties": {
            "when": {"type": "string", "format": "date-time"},
            "unit": {"enum": ["celsius", "fahrenheit"]},
            "kind": {"const": "forecast"},
            "score": {"type": "number", "exclusiveMinimum": 0, "maximum": 0.25},
            "rank": {"type": "integer", "minimum": 3.5, "maximum": 9},
            "note": {"type": ["null", "string"], "minLength": 12, "maxLength": 20},
            "flag": {"type": "boolean"},
        },
        "required": ["when", "unit"],
        "additionalProperties": False,
    },
    {
        "$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}}}},
        "type": "object",
        "properties": {
            "points": {"type": "array", "items": {"$ref": "#/$defs/point"}, "minItems": 3},
            "pair": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}]},
            "empty": {"type": "array", "maxItems": 0},
        },
    },
    {
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
            {"properties": {"b": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}},
        ]
    },
    {"type": "integer", "exclusiveMaximum": -4},
    {"type": "array", "items": {"oneOf": [{"type": "string", "format": "email"}]}},
]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_the_instance_satisfies_the_schema(schema: dict[str, Any]) -> None:
    value = instance(schema, itertools.cycle(WORDS))
    jsonschema.validate(value, schema)


def test_strings_are_words_of_the_vocabulary() -> None:
    value = instance({"type": "string"}, itertools.cycle(WORDS))
    assert value == "kalo mine"


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "pattern": "^[0-9]+$"},
        {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 7}}},
        {"not": {"type": "string"}},
        {"type": "integer", "minimum": 5, "maximum": 4},
        {"type": "number", "exclusiveMinimum": 1, "exclusiveMaximum": 1},
        {"$ref": "https://example.com/schema"},
        {"$ref": "#/$defs/missing"},
        {"type": "color"},
    ],
)
def test_what_it_cannot_honour_is_refused_not_faked(schema: dict[str, Any]) -> None:
    with pytest.raises(SchemaError):
        instance(schema, itertools.cycle(WORDS))
