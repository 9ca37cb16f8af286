"""Hugging Face generate()'s finishing rule (RefillBeams)."""
from typing import List, Optional

import torch

from onmt_lite.errors import OptionError
from onmt_lite.search.finishing.common import finished, take_finished

HF_EXCLUDED = -1.0e9  # Hugging Face's additive mask for beams that may not be chosen
EARLY_STOPPING = ("true", "false", "never")


class RefillBeams:
    """Hugging Face ``generate``'s beam search (transformers 5; see the module docstring)."""
    width_factor = 2

    def __init__(self, eos: int, max_length: int, n_best: int, alpha: float = 1.0,
                 early_stopping: str = "false"):
        if early_stopping not in EARLY_STOPPING:
            raise OptionError(f"-early_stopping must be one of {', '.join(EARLY_STOPPING)}")
        self.eos, self.max_length, self.n_best, self.alpha = eos, max_length, n_best, alpha
        self.early_stopping = early_stopping

    def start(self, batch: int, k: int, padding: torch.Tensor) -> None:
        device = padding.device
        self.k = k
        self.running = torch.zeros((batch, k), device=device)
        self.running[:, 1:] = HF_EXCLUDED  # the first step extends hypothesis 0 only
        self.best = torch.full((batch, k), HF_EXCLUDED, device=device)  # finished, best first
        self.is_finished = torch.zeros((batch, k), dtype=torch.bool, device=device)
        self.improvable = torch.ones(batch, dtype=torch.bool, device=device)
        self.slots: List[List[Optional[tuple]]] = [[None] * k for _ in range(batch)]

    def rank(self, log_probs: torch.Tensor, step: int, attn: torch.Tensor) -> torch.Tensor:
        return log_probs.add_(self.running.view(-1, 1))

    def advance(self, values, rows, tokens, step, attn, path):
        """As OnmtSlots.advance, with 2k candidates; returns the k that run on, (n, k)."""
        n, width = values.shape
        k = self.k
        ends = tokens.eq(self.eos) | (step >= self.max_length)
        # The k best candidates that did not end run on.
        running = values + ends.float() * HF_EXCLUDED
        going_on = running.topk(k, dim=1).indices
        self.running = running.gather(1, going_on)
        # Candidates among the first k that ended compete for the k finished slots.
        finishing = ends.clone()
        finishing[:, k:] = False
        normalised = values / (step ** self.alpha)
        if self.early_stopping == "true":
            normalised = normalised + self.is_finished.all(1, keepdim=True).float() * HF_EXCLUDED
        normalised = normalised + (~self.improvable).float().unsqueeze(1) * HF_EXCLUDED
        normalised = normalised + (~finishing).float() * HF_EXCLUDED
        merged = torch.cat([self.best, normalised], dim=1)
        chosen = merged.topk(k, dim=1).indices
        # generate() keeps whatever wins the merge, in the merge's order: a candidate that did
        # not end wins a tie at -1e9 with an empty slot, or as NaN (every piece banned and
        # renormalised), and is what it returns when nothing better ends (_update_finished_beams)
        take_finished(self.slots, chosen, width, path)
        self.best = merged.gather(1, chosen)
        self.is_finished = torch.cat([self.is_finished, finishing], dim=1).gather(1, chosen)
        # Can a running hypothesis still beat the worst finished one?
        length = self.max_length if self.early_stopping == "never" and self.alpha > 0 else step
        best_possible = self.running[:, :1] / (length ** self.alpha)
        worst = torch.where(self.is_finished, self.best.min(1, keepdim=True).values,
                            torch.tensor(HF_EXCLUDED, device=values.device))
        self.improvable &= (best_possible > worst).any(1)
        over = ~self.improvable
        if self.early_stopping == "true":
            over |= self.is_finished.all(1)
        if step >= self.max_length:
            over[:] = True
        done = {}
        if bool(over.any()):
            scores = self.best.tolist()
            for i in over.nonzero().view(-1).tolist():
                done[i] = [finished(slot, score) for slot, score
                           in zip(self.slots[i][:self.n_best], scores[i][:self.n_best])]
        return going_on, done

    def keep(self, sentences: torch.Tensor, rows: torch.Tensor) -> None:
        self.running = self.running.index_select(0, sentences)
        self.best = self.best.index_select(0, sentences)
        self.is_finished = self.is_finished.index_select(0, sentences)
        self.improvable = self.improvable.index_select(0, sentences)
        self.slots = [self.slots[i] for i in sentences.tolist()]
