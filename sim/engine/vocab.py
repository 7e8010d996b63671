"""The words an emulated replica "generates", each one token under the shared tokenizer.

Generated text has to survive a round trip: a client sends the answer back in
its next turn, the balancer and the replica tokenize it, and both must see the
same token ids the engine produced (and hashed into cacheable blocks).  So the
vocabulary keeps only words that the configured tokenizer encodes as exactly
one token when preceded by a space; with the built-in ``WordTokenizer`` that is
every generated word.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import product

from core.tokenizer import Tokenizer

# Pronounceable syllables; two- and three-syllable words give a few thousand
# distinct, stable words without shipping a word list.
_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "da", "pe", "ri", "zo", "ba", "ho")


class Vocabulary:
    """A fixed list of single-token words; token id <-> text both ways."""

    def __init__(
        self, tokenizer: Tokenizer, size: int = 1024, extra_words: Sequence[str] = ()
    ) -> None:
        self.token_ids: list[int] = []
        self._text: dict[int, str] = {}
        # extra_words: a model's own words (sim.engine.model_text), tried after the syllables.
        for word in [*self._candidates(), *extra_words]:
            piece = " " + word
            ids = tokenizer.encode(piece)
            if len(ids) == 1 and ids[0] not in self._text:
                self.token_ids.append(ids[0])
                self._text[ids[0]] = piece
                if len(self.token_ids) == size:
                    break
        if not self.token_ids:
            raise ValueError(f"tokenizer {tokenizer.name} encodes no candidate word as one token")

    @staticmethod
    def _candidates() -> list[str]:
        words = ["".join(parts) for parts in product(_SYLLABLES, repeat=2)]
        words += ["".join(parts) for parts in product(_SYLLABLES, repeat=3)]
        return words

    def __len__(self) -> int:
        return len(self.token_ids)

    def text(self, token_ids: list[int]) -> str:
        return "".join(self._text[token_id] for token_id in token_ids)
