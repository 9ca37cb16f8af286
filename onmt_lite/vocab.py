"""Vocabulary: token <-> id, built from a tokenized training file."""
import string
from collections import Counter
from typing import Dict, Iterable, List, Optional, Sequence

from onmt_lite.constants import BOS, EOS, PAD, SPECIALS, UNK

DEFAULT_SPECIALS = {"unk": UNK, "pad": PAD, "bos": BOS, "eos": EOS}


class Vocab:
    """Maps tokens to ids; unknown tokens map to ``<unk>``.

    Args:
        tokens: the tokens in id order (specials included).
        specials: the tokens of the roles unk, pad, bos (the decoder's first input) and eos
            where they are not OpenNMT-py's (Marian: ``<pad>`` is pad and bos).
    """

    def __init__(self, tokens: Sequence[str], specials: Optional[Dict[str, str]] = None):
        self.itos: List[str] = list(tokens)
        self.stoi = {tok: i for i, tok in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            raise ValueError("vocabulary has duplicate tokens")
        self.specials = {**DEFAULT_SPECIALS, **(specials or {})}
        missing = [tok for tok in self.specials.values() if tok not in self.stoi]
        if missing:
            raise ValueError(f"vocabulary lacks the special tokens {missing}")
        self.unk, self.pad = self.stoi[self.specials["unk"]], self.stoi[self.specials["pad"]]
        self.bos, self.eos = self.stoi[self.specials["bos"]], self.stoi[self.specials["eos"]]

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


UNKNOWN_SHARE_WARNING = 0.10  # warn when this share of source tokens (or more) is unknown


def unknown_tokens_warning(vocab: Vocab, lines: Sequence[Sequence[str]]) -> Optional[str]:
    """A warning naming the likely cause when many of ``lines``' tokens are unknown to
    ``vocab``, as when raw text meets a model of lowercased, tokenized words; else None."""
    tokens = [tok for line in lines for tok in line]
    unknown = [tok for tok in tokens if tok not in vocab.stoi]
    if len(unknown) < 2 or len(unknown) < UNKNOWN_SHARE_WARNING * len(tokens):
        return None
    causes = []
    lowercased = not any(c.isupper() for tok in vocab.itos for c in tok)
    cased = sum(tok.lower() in vocab.stoi for tok in unknown)
    if lowercased and cased:
        causes.append(f"the model's vocabulary is lowercased but {cased} of them are known in "
                      "lower case")
    glued = sum(tok.strip(string.punctuation) in vocab.stoi
                and tok.strip(string.punctuation) != tok for tok in unknown)
    if glued:
        causes.append(f"{glued} of them are known words with punctuation attached: the input "
                      "looks untokenized")
    cause = "; ".join(causes) if causes else (
        "the input may lack the tokenization or subword segmentation the model was trained on")
    return (f"{len(unknown)} of {len(tokens)} source tokens ({len(unknown) / len(tokens):.0%}) "
            f"are not in the model's vocabulary and become <unk>: {cause}")
