"""``/v1/embeddings`` as vLLM serves it for a pooling model (``--runner pooling``).

vLLM registers the embeddings route only when the model is a pooling model,
and the generation routes only when it generates, so each kind of emulated
replica answers the other's routes with FastAPI's 404 (``sim.replica``).

Request: ``input`` is a string, a list of strings, a list of token ids or a
list of such lists (one embedding each, in order), or chat messages, as
``input`` or ``messages``, rendered with the shared chat template.
``encoding_format`` is ``float`` (a list) or ``base64`` (little-endian
float32 bytes: vLLM's default ``embed_dtype`` in its machines' byte order; the
OpenAI SDK asks for this one by default).
``dimensions`` is refused as vLLM refuses it for a model without Matryoshka
embeddings.

The vector is deterministic in the token ids: feature hashing (each token adds
+-1 at two positions picked by a hash of its id), then L2-normalized, as
vLLM's embedding poolers normalize.  Texts sharing tokens point in similar
directions, so cosine similarity behaves plausibly, and it costs O(tokens).
"""

from __future__ import annotations

import base64
import math
import sys
import zlib
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from core.tokenizer import Tokenizer, render_chat
from sim.engine.openai_protocol import APIError, body_for_model

DEFAULT_EMBEDDING_SIZE = 384
_MAX_TOKEN_ID = 1 << 32


@dataclass(frozen=True)
class EmbeddingRequest:
    model: str
    inputs: list[list[int]]
    encoding_format: str


def parse_embedding(
    raw: bytes, *, model: str, tokenizer: Tokenizer, max_model_len: int
) -> EmbeddingRequest:
    """Validate an embeddings body; ``APIError`` with vLLM's status and message."""
    body = body_for_model(raw, model)
    if body.get("dimensions") is not None:
        raise APIError(
            f"Model {model!r} does not support Matryoshka embeddings; dimensions must be "
            f"unset (received dimensions={body['dimensions']}).",
            param="dimensions",
        )
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise APIError("`encoding_format` must be 'float' or 'base64'.", param="encoding_format")
    inputs = _inputs(body, tokenizer)
    for tokens in inputs:
        if not tokens:
            raise APIError("The input is empty.", param="input")
        if len(tokens) > max_model_len:
            raise APIError(
                f"This model's maximum context length is {max_model_len} tokens, but the "
                f"input has {len(tokens)} tokens.",
                param="input",
            )
    return EmbeddingRequest(model, inputs, encoding)


def _inputs(body: Mapping[str, Any], tokenizer: Tokenizer) -> list[list[int]]:
    messages = body.get("messages")
    given = body.get("input", messages)
    if given is None:
        raise APIError("`input` is required.", param="input")
    if isinstance(given, str):
        return [tokenizer.encode(given)]
    if isinstance(given, list) and given:
        if all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in given):
            return [tokenizer.encode(render_chat(given))]
        if _token_ids(given):
            return [list(given)]
        if all(isinstance(text, str) for text in given):
            return [tokenizer.encode(text) for text in given]
        if all(_token_ids(ids) for ids in given):
            return [list(ids) for ids in given]
    raise APIError(
        "`input` must be a string, a list of strings, a list of token ids or a list of "
        "token id lists.",
        param="input",
    )


def _token_ids(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < _MAX_TOKEN_ID for t in value
        )
    )


def embed(token_ids: Sequence[int], size: int) -> list[float]:
    """The unit vector of ``token_ids`` (feature hashing; see the module docstring)."""
    vector = [0.0] * size
    for token_id in token_ids:
        digest = zlib.crc32(token_id.to_bytes(4, "little"))
        vector[digest % size] += 1.0 if digest & 1 << 31 else -1.0
        vector[(digest >> 11) % size] += 0.5 if digest & 1 << 30 else -0.5
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    return [v / norm for v in vector]


def embedding_response(
    request_id: str,
    created: int,
    model: str,
    vectors: Sequence[list[float]],
    encoding_format: str,
    prompt_tokens: int,
) -> dict[str, Any]:
    data = [
        {"index": index, "object": "embedding", "embedding": _encoded(vector, encoding_format)}
        for index, vector in enumerate(vectors)
    ]
    usage = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
    }
    return {
        "id": request_id,
        "object": "list",
        "created": created,
        "model": model,
        "data": data,
        "usage": usage,
    }


def _encoded(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "float":
        return vector
    packed = array("f", vector)
    if sys.byteorder != "little":
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode()
