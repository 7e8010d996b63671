"""A tiny Llama-architecture model, built offline for real-engine tests.

Nothing is downloaded: the config is written here, the byte-level BPE tokenizer is
trained here with ``tokenizers`` on a corpus generated here, and the engine fills in
random weights itself (vLLM's ``--load-format dummy``). Output text is noise, which the
tests never read; what they check is the engine's scheduling, caching, metrics, usage
and KV events, all of which a random model exercises fully.

The chat template differs from Meridian's fallback rendering
(``core.tokenizer.render_chat``: ``<|role|>content\\n`` ... ``<|assistant|>``) on
purpose, so a balancer that renders chat its own way instead of with the model's template
cannot agree with the engine on a chat prompt's tokens.
"""

from __future__ import annotations

import json
import random
import struct
from array import array
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

BOS = "<s>"
EOS = "</s>"
# The trainer's upper bound; the corpus runs out of merges a little below it, and the
# config takes the tokenizer's real size, so the model can only sample ids that decode.
MAX_VOCAB = 512
MAX_POSITIONS = 4096
# Llama-style turns: "[INST] ... [/INST]" around user turns, the BOS token leading the
# conversation, EOS closing each assistant turn, and a generation prompt of its own.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}<<SYS>> {{ message['content'] }} <</SYS>>\n"
    "{% elif message['role'] == 'user' %}[INST] {{ message['content'] }} [/INST]"
    "{% else %} {{ message['content'] }}{{ eos_token }}\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %} Answer:{% endif %}"
)

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "hidden_act": "silu",
    "max_position_embeddings": MAX_POSITIONS,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}

_WORDS = [
    "the",
    "cache",
    "block",
    "prefix",
    "token",
    "route",
    "replica",
    "region",
    "balancer",
    "engine",
    "request",
    "stream",
    "event",
    "model",
    "prompt",
    "answer",
    "system",
    "user",
    "assistant",
    "document",
    "chapter",
    "section",
    "summary",
    "question",
    "context",
    "memory",
    "latency",
    "throughput",
    "queue",
    "batch",
]


def corpus(lines: int = 2000, seed: int = 7) -> list[str]:
    """Deterministic English-like lines: the same merges on every machine."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 16))) for _ in range(lines)]


def train_tokenizer() -> Tokenizer:
    """Byte-level BPE (GPT-2/Llama-3 style) that adds BOS, as Llama tokenizers do."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=MAX_VOCAB,
        special_tokens=["<unk>", BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A $B",
        special_tokens=[(BOS, tokenizer.token_to_id(BOS))],
    )
    return tokenizer


def build(directory: Path) -> Path:
    """Write the model (config, tokenizer, tokenizer config) into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer()
    assert tokenizer.token_to_id(BOS) == CONFIG["bos_token_id"]
    assert tokenizer.token_to_id(EOS) == CONFIG["eos_token_id"]
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {**CONFIG, "vocab_size": tokenizer.get_vocab_size()}
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    (directory / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": 2})
    )
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": "<unk>",
        "model_max_length": MAX_POSITIONS,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    return directory


LORA_RANK = 8


def build_lora(directory: Path, seed: int = 11) -> Path:
    """A random rank-8 LoRA adapter on every layer's q_proj and v_proj, in PEFT's layout
    (``adapter_config.json`` + ``adapter_model.safetensors``), for vLLM's ``--lora-modules``.
    Small enough to write the safetensors format by hand: no numpy or torch needed."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    hidden = CONFIG["hidden_size"]
    head_dim = CONFIG["head_dim"]
    outputs = {
        "q_proj": CONFIG["num_attention_heads"] * head_dim,
        "v_proj": CONFIG["num_key_value_heads"] * head_dim,
    }
    tensors: dict[str, tuple[list[int], array[float]]] = {}
    for layer in range(CONFIG["num_hidden_layers"]):
        for proj, out in outputs.items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            for name, shape in (("lora_A", [LORA_RANK, hidden]), ("lora_B", [out, LORA_RANK])):
                values = array("f", (rng.gauss(0.0, 0.01) for _ in range(shape[0] * shape[1])))
                tensors[f"{prefix}.{name}.weight"] = (shape, values)
    _write_safetensors(directory / "adapter_model.safetensors", tensors)
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": LORA_RANK,
        "lora_alpha": 2 * LORA_RANK,
        "lora_dropout": 0.0,
        "target_modules": list(outputs),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
    }
    (directory / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2))
    return directory


def _write_safetensors(path: Path, tensors: dict[str, tuple[list[int], array[float]]]) -> None:
    """safetensors: a little-endian u64 header length, a JSON header naming each tensor's
    dtype, shape and byte range, then the raw little-endian data."""
    header: dict[str, object] = {}
    offset = 0
    for name, (shape, values) in tensors.items():
        size = len(values) * values.itemsize
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    with path.open("wb") as out:
        out.write(struct.pack("<Q", len(encoded)))
        out.write(encoded)
        for _, values in tensors.values():
            out.write(values.tobytes())  # x86-64 and arm64 are little-endian
