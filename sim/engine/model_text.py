"""The served model's own tokenizer and chat template inside the emulated replica.

vLLM renders a chat request with the model's chat template and tokenizes it
with the model's tokenizer (``--tokenizer DIR``, else the model directory); a
balancer configured with the same files (``MERIDIAN_MODEL_TOKENIZERS``) must
arrive at the same ids.  Given the files, the emulator does the same through the
balancer's own code (``core.model_tokenizer``), so an end-to-end test
checks the two against each other, and a balancer left on the fallback shows
the mismatch a real engine would.

``ModelText`` gives the model tokenizer the emulator's ``Tokenizer`` shape (raw
text, no special tokens added), which the vocabulary and forced answers use;
``model_words`` lists the model's own single-token words, since the emulator's
syllable words are rarely one token under a real vocabulary.
"""

from __future__ import annotations

import re

from core.model_tokenizer import ModelTokenizer

_WORD = re.compile(r" [a-z]{2,12}")


class ModelText:
    """A ``ModelTokenizer`` as a ``core.tokenizer.Tokenizer`` (no special tokens)."""

    def __init__(self, model: ModelTokenizer) -> None:
        self.model = model
        self.name = f"model:{model.tokenizer_source}"

    def encode(self, text: str) -> list[int]:
        return list(self.model.encode(text, add_special_tokens=False))

    def count(self, text: str) -> int:
        return len(self.model.encode(text, add_special_tokens=False))


def model_words(model: ModelTokenizer, limit: int = 4096) -> list[str]:
    """Lower-case words (no leading space) that the model's vocabulary holds as one
    space-led token, in id order: candidates for the emulator's generated words."""
    words = []
    for token_id in range(model.vocab_size):
        text = model.decode([token_id])
        if _WORD.fullmatch(text):
            words.append(text[1:])
            if len(words) == limit:
                break
    return words
