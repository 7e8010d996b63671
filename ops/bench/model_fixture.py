"""A small model tokenizer built offline: byte-level BPE and a Llama-3-style chat template.

The routing bench and the tests need a *model* tokenizer (Hugging Face
``tokenizers``, special tokens, a real Jinja chat template) without a network
or a model download, so ``write_model_tokenizer`` trains one in a second on
deterministic English-like filler text and writes the Hugging Face layout:
``tokenizer.json`` and ``tokenizer_config.json`` with the chat template and
``add_bos_token``.  Its chat rendering deliberately differs from Meridian's fixed
template (headers, end-of-turn tokens, a BOS token), as a real model's does.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from sim.workloads.text import WORDS

BOS, EOS = "<|begin_of_text|>", "<|eot_id|>"
HEADER_START, HEADER_END = "<|start_header_id|>", "<|end_header_id|>"
SPECIAL_TOKENS = [BOS, EOS, HEADER_START, HEADER_END, "<|end_of_text|>"]
VOCAB_SIZE = 8192

# The shape of Llama 3's template: BOS once, a header per message, an end-of-turn token,
# the assistant header as the generation prompt; tools go into the first user turn.
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if tools %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\nYou may call these functions:\\n' }}"
    "{%- for tool in tools %}{{- tool | tojson }}{{- '\\n' }}{%- endfor %}"
    "{{- '<|eot_id|>' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{- raise_exception('unknown role ' + message['role']) }}"
    "{%- endif %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] | trim }}"
    "{%- else %}{%- for part in message['content'] %}{{- part['text'] | trim }}{%- endfor %}"
    "{%- endif %}"
    "{{- '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)


def training_corpus(seed: int = 0, lines: int = 2000) -> list[str]:
    rng = random.Random(f"model-fixture-{seed}")
    words = WORDS
    corpus = []
    for _ in range(lines):
        sentence = " ".join(rng.choice(words) for _ in range(rng.randrange(8, 40)))
        corpus.append(sentence.capitalize() + rng.choice([".", "?", "!", ",", ":"]))
    return corpus


def train_tokenizer(seed: int = 0) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_corpus(seed), trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS}:0 $A:0", pair=f"{BOS}:0 $A:0 $B:1", special_tokens=[(BOS, bos_id)]
    )
    return tok


def write_model_tokenizer(directory: Path, seed: int = 0) -> Path:
    """Train and write the tokenizer files into ``directory``; returns it."""
    directory.mkdir(parents=True, exist_ok=True)
    train_tokenizer(seed).save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "add_bos_token": True,
        "chat_template": CHAT_TEMPLATE,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return directory
