"""Translation: the result for one source line, and its output and log formatting."""
from dataclasses import dataclass, field
from typing import List, Optional

import torch


@dataclass
class Translation:
    """n-best hypotheses of one source line.

    Attributes:
        src: the source tokens as given; src_vocab: as the model sees them (``<unk>`` for OOV).
        preds: n-best token lists, best first, without ``</s>``.
        scores: their scores; attns: their attention (len(pred) + 1 if it ended in ``</s>``, src_len).
        gold / gold_score: the reference and its log-probability with ``-tgt``.
        texts: the n-best hypotheses as raw text, where a subword transform joined the pieces.
    """
    index: int
    src: List[str]
    src_vocab: List[str]
    preds: List[List[str]] = field(default_factory=list)
    scores: List[float] = field(default_factory=list)
    attns: List[torch.Tensor] = field(default_factory=list)
    gold: Optional[List[str]] = None
    gold_score: Optional[float] = None
    texts: Optional[List[str]] = None

    def output_lines(self, with_score: bool = False) -> List[str]:
        """One line per n-best hypothesis; with_score appends a tab and the score."""
        lines = self.texts if self.texts is not None else [" ".join(p) for p in self.preds]
        if with_score:
            lines = [f"{line}\t{score}" for line, score in zip(lines, self.scores)]
        return lines

    def log(self, number: int) -> str:
        """The -verbose report, in OpenNMT-py's layout."""
        msg = [f"\nSENT {number}: {self.src_vocab}\n",
               f"PRED {number}: {' '.join(self.preds[0])}\n",
               f"PRED SCORE: {self.scores[0]:.4f}\n"]
        if self.gold is not None:
            msg.append(f"GOLD {number}: {' '.join(self.gold)}\n")
            msg.append(f"GOLD SCORE: {self.gold_score:.4f}\n")
        if len(self.preds) > 1:
            msg.append("\nBEST HYP:\n")
            msg.extend(f"[{score:.4f}] {pred}\n" for score, pred in zip(self.scores, self.preds))
        return "".join(msg)
