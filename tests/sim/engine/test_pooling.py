"""Embeddings of an emulated pooling model: request forms, vectors, vLLM's response shape."""

from __future__ import annotations

import base64
import json
import math
import struct

import pytest

from core.tokenizer import WordTokenizer, render_chat
from sim.engine.openai_protocol import APIError
from sim.engine.pooling import embed, embedding_response, parse_embedding

TOKENIZER = WordTokenizer()


def parse(**body: object) -> list[list[int]]:
    raw = json.dumps({"model": "e", **body}).encode()
    return parse_embedding(raw, model="e", tokenizer=TOKENIZER, max_model_len=64).inputs


def test_every_input_form_is_one_embedding_in_order() -> None:
    assert parse(input="a b") == [TOKENIZER.encode("a b")]
    assert parse(input=["a", "b c"]) == [TOKENIZER.encode("a"), TOKENIZER.encode("b c")]
    assert parse(input=[1, 2]) == [[1, 2]]
    assert parse(input=[[1], [2, 3]]) == [[1], [2, 3]]
    messages = [{"role": "user", "content": "hi"}]
    assert (
        parse(messages=messages)
        == parse(input=messages)
        == [TOKENIZER.encode(render_chat(messages))]
    )


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"input": "x", "dimensions": 8}, 400, "dimensions"),
        ({"input": "x", "encoding_format": "bytes"}, 400, "encoding_format"),
        ({"input": {"a": 1}}, 400, "input"),
        ({"input": ""}, 400, "input"),
        ({"input": "x " * 70}, 400, "input"),
        ({"input": "x", "model": "other"}, 404, "model"),
    ],
)
def test_what_vllm_refuses_is_refused(body: dict[str, object], status: int, param: str) -> None:
    with pytest.raises(APIError) as info:
        parse(**body)
    assert (info.value.status, info.value.body["error"]["param"]) == (status, param)


def test_vectors_are_unit_length_deterministic_and_closer_for_shared_tokens() -> None:
    base = embed(TOKENIZER.encode("the harbour at dawn is quiet"), 64)
    near = embed(TOKENIZER.encode("the harbour at dawn is loud"), 64)
    far = embed(TOKENIZER.encode("seven green parrots argue loudly"), 64)
    assert math.isclose(sum(v * v for v in base), 1.0)
    assert base == embed(TOKENIZER.encode("the harbour at dawn is quiet"), 64)

    def cosine(a: list[float], b: list[float]) -> float:
        return sum(x * y for x, y in zip(a, b, strict=True))

    assert cosine(base, near) > cosine(base, far)


def test_base64_is_little_endian_float32_as_the_sdk_decodes_it() -> None:
    vector = embed([1, 2, 3], 8)
    response = embedding_response("embd-1", 0, "e", [vector], "base64", 3)
    packed = base64.b64decode(response["data"][0]["embedding"])
    assert list(struct.unpack("<8f", packed)) == pytest.approx(vector, rel=1e-6)
    assert response["usage"] == {
        "prompt_tokens": 3, "total_tokens": 3, "completion_tokens": 0, "prompt_tokens_details": None
    }  # fmt: skip
