"""What every finishing rule shares: the finished Hypothesis, and the slots of finished
hypotheses that several rules keep."""
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import torch


@dataclass
class Hypothesis:
    tokens: List[int]  # without <s>, with </s> if it ended so
    score: float
    attn: torch.Tensor  # (len(tokens), src_len)


# (candidate row) -> (token ids without <s>, attention (len, src_len)) of that candidate
CandidatePath = Callable[[int], Tuple[torch.Tensor, torch.Tensor]]


def take_finished(slots: List[list], chosen: torch.Tensor, width: int,
                  path: CandidatePath) -> None:
    """Each sentence's k finished slots after a merge: ``chosen`` (n, k) indexes the old slots
    (below k) and then the step's candidates (k and up)."""
    k = len(slots[0])
    unchanged = list(range(k))
    for i, picks in enumerate(chosen.tolist()):
        if picks != unchanged:
            slots[i] = [slots[i][j] if j < k else path(i * width + j - k) for j in picks]


def finished(slot: Optional[tuple], score: float) -> Hypothesis:
    """The Hypothesis of a finished slot with its final ``score``."""
    if slot is None:  # a slot no hypothesis reached (every candidate ended early)
        return Hypothesis([], score, torch.zeros(0, 0))
    tokens, attn = slot
    return Hypothesis(tokens.tolist(), score, attn)
