"""Random sampling of the next token: top-k, nucleus (top-p) and temperature."""
from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class Sampler:
    """Random sampling: keep the ``topk`` best tokens (0 = all) or the smallest set whose
    probability reaches ``topp`` (0 = off), divide the logits by ``temperature``, sample."""
    topk: int = 0
    topp: float = 0.0
    temperature: float = 1.0
    generator: Optional[torch.Generator] = None

    def pick(self, log_probs: torch.Tensor) -> torch.Tensor:
        """(B, V) -> (B,) sampled token ids."""
        logits = log_probs / max(self.temperature, 1e-6)
        if self.topk > 0:
            kth = logits.topk(min(self.topk, logits.size(1)), dim=1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.topp > 0:
            sorted_logits, order = logits.sort(dim=1, descending=True)
            cumulative = sorted_logits.softmax(1).cumsum(1)
            drop = cumulative - sorted_logits.softmax(1) >= self.topp  # keep the first crossing
            logits = logits.scatter(1, order, sorted_logits.masked_fill(drop, float("-inf")))
        return torch.multinomial(logits.softmax(1), 1, generator=self.generator).view(-1)
