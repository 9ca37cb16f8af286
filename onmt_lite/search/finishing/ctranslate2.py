"""CTranslate2's finishing rule (ReplaceFinished)."""
from typing import List, Optional

import torch

from onmt_lite.search.finishing.common import Hypothesis

CT2_PENALISED = -1.0e10  # CTranslate2's score for what a target prefix rules out


class ReplaceFinished:
    """CTranslate2's beam search (4.x ``BeamSearch``): ranks by summed log-probability and takes
    2k candidates; each of the first k that ends in ``</s>`` is recorded (raw score) and its
    slot goes to the next candidate beyond the first k that did not end. A sentence is done at
    ``max_length``, or when round(k * patience) hypotheses are recorded; with alpha 0 instead,
    as soon as its best candidate has ended once and ``n_best`` are recorded. Recorded scores
    are then divided by length ** alpha (``</s>`` counted) and the best ``n_best`` kept.

    With target prefixes (CTranslate2's ``target_prefix``), every candidate of a sentence takes
    the prefix's next token while it lasts, from the first hypothesis: that one with score 0, the
    others -1e10, so a hypothesis scores only what follows its prefix. At the first step after
    the prefix, a ``</s>`` candidate other than the best becomes token 0 with score -1e10.

    Args:
        prefixes: (batch, P) prefix token ids, each followed by ``</s>`` and padding.
    """
    width_factor = 2

    def __init__(self, eos: int, max_length: int, n_best: int, alpha: float = 1.0,
                 patience: float = 1.0, prefixes: Optional[torch.Tensor] = None):
        self.eos, self.max_length, self.n_best, self.alpha = eos, max_length, n_best, alpha
        self.patience = patience
        self.prefixes = prefixes
        if prefixes is not None:  # the index of each prefix's </s> is its length
            self.prefix_lengths = prefixes.eq(eos).int().argmax(1)

    def start(self, batch: int, k: int, padding: torch.Tensor) -> None:
        self.k = k
        self.max_candidates = int(k * self.patience + 0.5)  # C++ round: half away from 0
        self.running = torch.full((batch, k), float("-inf"), device=padding.device)
        self.running[:, 0] = 0.0  # the first step extends hypothesis 0 only
        self.top_ended = [False] * batch
        self.recorded: List[list] = [[] for _ in range(batch)]  # (score, tokens, attn)

    def rank(self, log_probs: torch.Tensor, step: int, attn: torch.Tensor) -> torch.Tensor:
        return log_probs.add_(self.running.view(-1, 1))

    def revise(self, values, origin, tokens, step):
        """The target prefixes' rule (see the class docstring) on the chosen candidates."""
        if self.prefixes is None:
            return values, origin, tokens
        position = step - 1  # tokens of the prefix before this step's
        forced = (self.prefix_lengths > position).unsqueeze(1)  # (n, 1)
        if bool(forced.any()):
            wanted = self.prefixes[:, min(position, self.prefixes.size(1) - 1)].unsqueeze(1)
            first = torch.zeros_like(values)
            first[:, 1:] = CT2_PENALISED
            values, origin = values.where(~forced, first), origin.masked_fill(forced, 0)
            tokens = tokens.where(~forced, wanted.expand_as(tokens))
        early = tokens.eq(self.eos) & (self.prefix_lengths == position).unsqueeze(1)
        early[:, 0] = False
        if bool(early.any()):
            values = values.masked_fill(early, CT2_PENALISED)
            origin, tokens = origin.masked_fill(early, 0), tokens.masked_fill(early, 0)
        return values, origin, tokens

    def advance(self, values, rows, tokens, step, attn, path):
        n, width = values.shape
        k = self.k
        last = step >= self.max_length
        ends = tokens.eq(self.eos)
        if self.prefixes is not None:  # a prefix's own </s> ends nothing
            ends &= (self.prefix_lengths < step).unsqueeze(1)
        going_on, done = k, {}  # the first k candidates of each sentence (Paths.choose)
        if last or bool(ends[:, :k].any()):
            ends_l, scores = ends.tolist(), values.tolist()
            going = [list(range(k)) for _ in range(n)]
            for i in range(n):
                if not last and not any(ends_l[i][:k]):
                    continue
                spare = k  # the next candidate that may take a finished one's slot
                for j in (j for j in range(k) if last or ends_l[i][j]):
                    self.top_ended[i] |= j == 0
                    self.recorded[i].append((scores[i][j], *path(i * width + j)))
                    while spare < width and ends_l[i][spare]:
                        spare += 1
                    if spare < width:
                        going[i][j], spare = spare, spare + 1
                count = len(self.recorded[i])
                # CTranslate2 4.x, src/decoding.cc BeamSearch::search: with length_penalty 0
                # ("allow_early_exit") a sentence ends only when its top beam has finished and
                # num_hypotheses are recorded; patience (_max_candidates) plays no part
                if last or (self.top_ended[i] and count >= self.n_best if self.alpha == 0
                            else count >= self.max_candidates):
                    done[i] = self._best(self.recorded[i])
            going_on = torch.tensor(going, device=values.device)
            self.running = values.gather(1, going_on)
        else:
            self.running = values[:, :k].contiguous()
        return going_on, done

    def _best(self, recorded: list) -> List[Hypothesis]:
        ranked = sorted(((score / len(tokens) ** self.alpha, tokens, attn)
                         for score, tokens, attn in recorded), key=lambda h: h[0], reverse=True)
        return [Hypothesis(t.tolist(), s, a) for s, t, a in ranked[:self.n_best]]

    def keep(self, sentences: torch.Tensor, rows: torch.Tensor) -> None:
        self.running = self.running.index_select(0, sentences)
        if self.prefixes is not None:
            self.prefixes = self.prefixes.index_select(0, sentences)
            self.prefix_lengths = self.prefix_lengths.index_select(0, sentences)
        kept = sentences.tolist()
        self.top_ended = [self.top_ended[i] for i in kept]
        self.recorded = [self.recorded[i] for i in kept]
