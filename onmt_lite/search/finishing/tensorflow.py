"""TensorFlow official models' finishing rule (AliveFinished)."""
from typing import List, Optional

import torch

from onmt_lite.errors import OptionError
from onmt_lite.search.finishing.common import finished, take_finished

TF_INF = 1.0e7  # TensorFlow official models' finite "infinity" for float32


def _top_first(scores: torch.Tensor, k: int) -> torch.Tensor:
    """The indices of each row's k best scores, ties to the lower index, as tf.nn.top_k: an
    unfinished candidate scored -1e7 in float32 must not displace an empty finished slot
    (also -1e7) that comes before it. torch.topk breaks ties either way."""
    return scores.sort(dim=1, descending=True, stable=True).indices[:, :k]


class AliveFinished:
    """The beam search of TensorFlow's official models (``official/nlp/modeling/ops/
    beam_search.py``): 2k candidates by summed log-probability; the k best that did not end stay
    alive; every ending candidate competes for the k finished slots with score divided by
    ((5 + generated length) / 6) ** alpha (GNMT's, ``</s>`` counted). The search stops when,
    for every sentence of the batch, the worst finished score (over the filled slots only)
    beats the best alive score divided by the normalisation at ``max_length``, or at
    ``max_length`` (so a sentence's result depends on its batch, as in TensorFlow); a sentence
    with nothing finished returns its alive hypotheses and their summed log-probabilities."""
    width_factor = 2

    def __init__(self, eos: int, max_length: int, n_best: int, alpha: float = 0.6):
        if alpha < 0:
            raise OptionError("-search tf needs -alpha 0 or more (its stop rule assumes it)")
        self.eos, self.max_length, self.n_best, self.alpha = eos, max_length, n_best, alpha

    def _norm(self, length: int) -> float:
        return ((5.0 + length) / 6.0) ** self.alpha

    def start(self, batch: int, k: int, padding: torch.Tensor) -> None:
        device = padding.device
        self.k = k
        self.alive = torch.full((batch, k), float("-inf"), device=device)
        self.alive[:, 0] = 0.0
        self.scores = torch.full((batch, k), -TF_INF, device=device)
        self.flags = torch.zeros((batch, k), dtype=torch.bool, device=device)
        self.slots: List[List[Optional[tuple]]] = [[None] * k for _ in range(batch)]

    def rank(self, log_probs: torch.Tensor, step: int, attn: torch.Tensor) -> torch.Tensor:
        return log_probs.add_(self.alive.view(-1, 1))

    def advance(self, values, rows, tokens, step, attn, path):
        n, width = values.shape
        k = self.k
        ends = tokens.eq(self.eos).float()
        alive = values + ends * -TF_INF
        going_on = _top_first(alive, k)
        self.alive = alive.gather(1, going_on)
        new = values / self._norm(step) + (1.0 - ends) * -TF_INF
        merged = torch.cat([self.scores, new], dim=1)
        chosen = _top_first(merged, k)
        if bool(ends.any()):
            take_finished(self.slots, chosen, width, path)
        self.scores = merged.gather(1, chosen)
        self.flags = torch.cat([self.flags, ends.bool()], dim=1).gather(1, chosen)
        best_alive = self.alive[:, 0] / self._norm(self.max_length)
        lowest = (self.scores * self.flags.float()).min(1).values \
            + (~self.flags.any(1)).float() * -TF_INF
        satisfied = lowest > best_alive
        # TensorFlow stops the whole batch at once: till then a sentence with empty finished
        # slots still takes new finished hypotheses, so only a full one is done earlier
        over = satisfied & self.flags.all(1)
        if step >= self.max_length or bool(satisfied.all()):
            over[:] = True
        done = {}
        if bool(over.any()):
            scores, alive_scores = self.scores.tolist(), self.alive.tolist()
            for i in over.nonzero().view(-1).tolist():
                if bool(self.flags[i].any()):
                    pairs = zip(self.slots[i], scores[i])
                else:  # nothing finished: the alive hypotheses, as TensorFlow returns them
                    pairs = zip((path(i * width + j) for j in going_on[i].tolist()),
                                alive_scores[i])
                done[i] = [finished(slot, score) for slot, score in list(pairs)[:self.n_best]]
        return going_on, done

    def keep(self, sentences: torch.Tensor, rows: torch.Tensor) -> None:
        self.alive = self.alive.index_select(0, sentences)
        self.scores = self.scores.index_select(0, sentences)
        self.flags = self.flags.index_select(0, sentences)
        self.slots = [self.slots[i] for i in sentences.tolist()]
