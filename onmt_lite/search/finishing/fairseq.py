"""fairseq's finishing rules (FirstFinished; DiverseGroups, its diverse beam search)."""
from typing import List, Tuple

import torch

from onmt_lite.errors import OptionError
from onmt_lite.search.finishing.common import Hypothesis


class FirstFinished:
    """fairseq 0.12's ``SequenceGenerator`` with ``BeamSearch``: 2k candidates by summed
    log-probability; each of the first k that ends in ``</s>`` is finalized, in candidate order,
    with score / length ** alpha (``</s>`` counted), while the sentence has fewer than k; the
    first k candidates (by rank) that did not end run on. A sentence is done with k finalized,
    or at the last step, where only ``</s>`` may follow (so ``max_length`` tokens, then
    ``</s>``)."""
    width_factor = 2

    def __init__(self, eos: int, max_length: int, n_best: int, alpha: float = 1.0):
        self.eos, self.max_length, self.n_best, self.alpha = eos, max_length + 1, n_best, alpha

    def start(self, batch: int, k: int, padding: torch.Tensor) -> None:
        self.k = k
        self.running = torch.full((batch, k), float("-inf"), device=padding.device)
        self.running[:, 0] = 0.0  # the first step extends hypothesis 0 only
        self.finalized: List[list] = [[] for _ in range(batch)]  # (score, tokens, attn)

    def rank(self, log_probs: torch.Tensor, step: int, attn: torch.Tensor) -> torch.Tensor:
        return log_probs.add_(self.running.view(-1, 1))

    def advance(self, values, rows, tokens, step, attn, path):
        n, width = values.shape
        k = self.k
        ends = tokens.eq(self.eos) & values.ne(float("-inf"))
        # the first k candidates that did not end run on (ended ones rank after every other)
        order = ends.long() * width + torch.arange(width, device=values.device)
        going_on = order.topk(k, dim=1, largest=False).indices
        self.running = values.gather(1, going_on)
        done = {}
        finishing = ends[:, :k]
        if bool(finishing.any()):
            scores = (values[:, :k] / step ** self.alpha).tolist()
            for i, js in enumerate(finishing.tolist()):
                for j in (j for j in range(k) if js[j] and len(self.finalized[i]) < k):
                    self.finalized[i].append((scores[i][j], *path(i * width + j)))
                if any(js) and (len(self.finalized[i]) == k or step == self.max_length):
                    ranked = sorted(self.finalized[i], key=lambda h: h[0], reverse=True)
                    done[i] = [Hypothesis(t.tolist(), s, a) for s, t, a in ranked[:self.n_best]]
        return going_on, done

    def keep(self, sentences: torch.Tensor, rows: torch.Tensor) -> None:
        self.running = self.running.index_select(0, sentences)
        self.finalized = [self.finalized[i] for i in sentences.tolist()]


class DiverseGroups(FirstFinished):
    """fairseq's ``DiverseBeamSearch`` (Hamming diversity): the beam is ``groups`` groups of
    k / groups hypotheses (hypothesis j in group j mod groups); group g chooses its 2k / groups
    candidates with every token's log-probability lowered by ``strength`` times the number of
    candidates of groups before it that chose that token at this step (the penalty stays in
    the score). The groups' candidates are interleaved, then finished as by FirstFinished.

    It is its own candidate selection (the loop's ``pick``): the penalty goes on the step's
    log-probabilities before the running scores, in fairseq's order of additions."""

    def __init__(self, eos: int, max_length: int, n_best: int, alpha: float = 1.0,
                 groups: int = 1, strength: float = 0.5):
        super().__init__(eos, max_length, n_best, alpha)
        self.groups, self.strength = groups, strength

    def start(self, batch, k, padding):
        if k % self.groups:
            raise OptionError(f"-diverse_groups {self.groups} must divide -beam_size {k}")
        super().start(batch, k, padding)

    def rank(self, log_probs, step, attn):
        self.first = step == 1
        return log_probs  # the running scores are added in pick

    def pick(self, log_probs: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """(n, k, V) step log-probs -> values and indices (n, 2k) into the flattened k * V."""
        n, _, vocab = log_probs.shape
        groups = self.groups
        seen = torch.zeros(n, vocab, device=log_probs.device)  # tokens earlier groups chose
        values, tokens, beams = [], [], []
        for g in range(groups):
            group = log_probs[:, g::groups, :]
            if g > 0:
                group = torch.add(group, seen.unsqueeze(1), alpha=-self.strength)
            if self.first:  # every hypothesis is the same: extend the group's first
                group = group[:, :1, :]
            else:
                group = group + self.running[:, g::groups].unsqueeze(-1)
            flat = group.reshape(n, -1)
            top = flat.topk(min(2 * k // groups, flat.size(1) - 1), dim=1)
            token = top.indices % vocab
            values.append(top.values)
            tokens.append(token)
            beams.append(torch.div(top.indices, vocab, rounding_mode="floor") * groups + g)
            seen.scatter_add_(1, token, torch.ones_like(top.values))
        values, tokens, beams = (torch.stack(x, dim=2).view(n, -1)
                                 for x in (values, tokens, beams))
        return values, beams * vocab + tokens
