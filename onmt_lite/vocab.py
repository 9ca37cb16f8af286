"""Vocabulary: token <-> id, built from a tokenized training file."""
from collections import Counter
from typing import Iterable, List, Sequence

from onmt_lite.constants import BOS, EOS, PAD, SPECIALS, UNK


class Vocab:
    """Maps tokens to ids; unknown tokens map to ``<unk>``.

    Args:
        tokens: the tokens in id order (specials included).
    """

    def __init__(self, tokens: Sequence[str]):
        self.itos: List[str] = list(tokens)
        self.stoi = {tok: i for i, tok in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            raise ValueError("vocabulary has duplicate tokens")
        missing = [tok for tok in SPECIALS if tok not in self.stoi]
        if missing:
            raise ValueError(f"vocabulary lacks the special tokens {missing}")
        self.unk, self.pad = self.stoi[UNK], self.stoi[PAD]
        self.bos, self.eos = self.stoi[BOS], self.stoi[EOS]

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, tokens: Iterable[str]) -> List[int]:
        return [self.stoi.get(tok, self.unk) for tok in tokens]

    def decode(self, ids: Iterable[int]) -> List[str]:
        return [self.itos[i] for i in ids]

    @classmethod
    def build(cls, lines: Iterable[str], min_freq: int = 1, max_size: int = 0,
              size_multiple: int = 1) -> "Vocab":
        """Builds a vocabulary from whitespace-tokenized lines.

        Tokens are ordered by descending count, then alphabetically; ``max_size`` (0 = no
        limit) excludes the specials. The size is padded to a multiple of ``size_multiple``
        with filler tokens, as OpenNMT-py does.
        """
        counts = Counter(tok for line in lines for tok in line.split())
        ranked = sorted((c, t) for t, c in counts.items() if c >= min_freq and t not in SPECIALS)
        ranked.sort(key=lambda ct: (-ct[0], ct[1]))
        words = [t for _, t in ranked]
        if max_size > 0:
            words = words[:max_size]
        tokens = list(SPECIALS) + words
        filler = 0
        while len(tokens) % size_multiple:
            tokens.append(f"averyunlikelytoken{filler}")
            filler += 1
        return cls(tokens)
