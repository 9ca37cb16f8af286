"""OpenNMT-py's finishing rule (OnmtSlots)."""
from typing import Dict, List, Optional, Tuple

import torch
from torch.nn import functional as F

from onmt_lite.constants import FINISHED_SCORE
from onmt_lite.search.finishing.common import CandidatePath, Hypothesis
from onmt_lite.search.global_scorer import GNMTGlobalScorer


class OnmtSlots:
    """OpenNMT-py's beam search (see the package's docstring), with GNMTGlobalScorer penalties."""
    width_factor = 1

    def __init__(self, scorer: GNMTGlobalScorer, eos: int, max_length: int, n_best: int,
                 stepwise_penalty: bool = False, ratio: float = 0.0):
        self.scorer, self.eos, self.max_length, self.n_best = scorer, eos, max_length, n_best
        self.stepwise = stepwise_penalty and scorer.has_cov_pen
        self.ratio = ratio

    def start(self, batch: int, k: int, padding: torch.Tensor) -> None:
        """``padding``: (batch * k, S) source padding of each row (full coverage: no penalty)."""
        self.k, self.padding = k, padding
        self.scores = torch.full((batch, k), float("-inf"), device=padding.device)
        self.scores[:, 0] = 0.0  # the first step extends hypothesis 0 only
        self.coverage: Optional[torch.Tensor] = None  # (rows, S) summed attention
        self.prev_penalty: Optional[torch.Tensor] = None  # (n, k)
        self.finished: List[list] = [[] for _ in range(batch)]  # (score, tokens, attn)
        self.best = [-1e10] * batch  # -ratio: the best finished score per token
        self.sentences = list(range(batch))  # the batch's sentence at each live position
        self.src_lengths = (~padding[::k]).sum(1).tolist()
        self.born: Optional[List[int]] = None  # each sentence's first step, once some joined
        self.max_lengths: List[int] = []  # each sentence's own limit, once some joined

    @property
    def joinable(self) -> bool:
        """Sentences may join between steps (``join``): no rule here reads the batch as a
        whole (-ratio reads other rows' source lengths; coverage and its penalties the source
        width)."""
        return self.ratio <= 0 and not self.scorer.has_cov_pen

    def join(self, padding: torch.Tensor, max_lengths: List[int], step: int) -> None:
        """Sentences, their rows' source ``padding`` (sentences * k, S), start at ``step``
        (their own first) and end by their own ``max_lengths``."""
        count = len(max_lengths)
        if self.born is None:
            self.born = [1] * self.scores.size(0)
            self.max_lengths = [self.max_length] * self.scores.size(0)
        self.born += [step] * count
        self.max_lengths += max_lengths
        scores = torch.full((count, self.k), float("-inf"), device=padding.device)
        scores[:, 0] = 0.0
        self.scores = torch.cat([self.scores, scores])
        width = max(self.padding.size(1), padding.size(1))
        self.padding = torch.cat([F.pad(p, (0, width - p.size(1)), value=True)
                                  for p in (self.padding, padding)])
        self.finished += [[] for _ in range(count)]
        self.best += [-1e10] * count
        first = max(self.sentences, default=-1) + 1
        self.sentences += range(first, first + count)  # (their source lengths: -ratio only)

    def _own(self, step: int) -> List[int]:
        """Each sentence's own step."""
        return [step - born + 1 for born in self.born]

    def _cov_penalty(self, coverage: torch.Tensor) -> torch.Tensor:
        return self.scorer.cov_penalty(coverage.masked_fill(self.padding, 1.0))

    def rank(self, log_probs: torch.Tensor, step: int, attn: torch.Tensor) -> torch.Tensor:
        """(rows, V) step log-probs -> candidate scores, in place: running score added,
        divided by the length penalty of a hypothesis that ends after this token."""
        n = self.scores.size(0)
        if self.stepwise and self.prev_penalty is not None:
            self.scores = (self.scores + self.prev_penalty
                           - self._cov_penalty(self.coverage + attn).view(n, self.k))
        curr = log_probs.add_(self.scores.view(-1, 1))  # in place: no new (rows, V) buffer
        if self.born is not None:  # a penalty per sentence, at its own step
            self.lp = torch.tensor([[self.scorer.length_penalty(own + 1)] for own in
                                    self._own(step)], device=curr.device)
            curr.view(n, self.k, -1).div_(self.lp.unsqueeze(2))
            return curr
        self.lp = self.scorer.length_penalty(step + 1)  # +1: the </s> that may follow
        if self.lp != 1:
            curr.div_(self.lp)
        return curr

    def advance(self, values: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor, step: int,
                attn: torch.Tensor, path: CandidatePath
                ) -> Tuple[Optional[torch.Tensor], Dict[int, List[Hypothesis]]]:
        """Takes the step's chosen candidates: ``values``, ``rows`` (origin rows) and ``tokens``,
        (n, k) each, ``attn`` (n * k, S) their attention. Returns which candidates run on (None:
        all, in order) and the n-best lists of the sentences done at this step."""
        n, k = values.shape
        top = values
        scores = values * self.lp
        if self.scorer.has_cov_pen:  # coverage follows the chosen paths
            if self.coverage is None:
                self.coverage, self.prev_penalty = attn, torch.zeros_like(scores)
            else:
                self.coverage = self.coverage.index_select(0, rows.view(-1)) + attn
                self.prev_penalty = self._cov_penalty(self.coverage).view(n, k)
            if not self.stepwise:
                top = top - self._cov_penalty(self.coverage).view(n, k)
        if self.born is None:
            own = [step] * n
            ended = tokens.eq(self.eos) if step < self.max_length else torch.ones_like(
                tokens, dtype=torch.bool)
        else:  # each sentence at its own step, to its own limit
            own = self._own(step)
            last = [s >= limit for s, limit in zip(own, self.max_lengths)]
            ended = tokens.eq(self.eos)
            if any(last):
                ended |= torch.tensor(last, device=tokens.device).unsqueeze(1)
        done = {}
        if bool(ended.any()):
            scores = scores.masked_fill(ended, FINISHED_SCORE)
            ended_rows, top = ended.tolist(), top.tolist()
            for i in range(n):
                for j in (j for j in range(k) if ended_rows[i][j]):
                    self.finished[i].append((top[i][j], *path(i * k + j)))
                    self.best[i] = max(self.best[i], top[i][j] / (own[i] + 2))
                if any(ended_rows[i]) and self._stops(i, ended_rows[i], top[i][0]) and \
                        len(self.finished[i]) >= self.n_best:
                    ranked = sorted(self.finished[i], key=lambda f: f[0], reverse=True)
                    done[i] = [Hypothesis(t.tolist(), s, a) for s, t, a in ranked[:self.n_best]]
        self.scores = scores
        return None, done

    def _stops(self, i: int, ended: List[bool], top: float) -> bool:
        """A sentence with a finished hypothesis stops when its top candidate ended; with
        -ratio, when that candidate's score per expected token (source length x ratio) cannot
        beat the best finished score per token, or when all ended. OpenNMT-py reads the source
        length of row i, not of sentence i: of its live sentence i // k, counted in input order
        (kept here, as it decides)."""
        if self.ratio <= 0:
            return ended[0]
        in_order = sorted(self.sentences)
        row = in_order.index(self.sentences[i])
        src_len = self.src_lengths[in_order[row // self.k]]
        return top / (src_len * self.ratio) <= self.best[i] or all(ended)

    def keep(self, sentences: torch.Tensor, rows: torch.Tensor) -> None:
        """Keeps the state of ``sentences`` (their ``rows``), in that order."""
        self.scores = self.scores.index_select(0, sentences)
        self.padding = self.padding.index_select(0, rows)
        if self.coverage is not None:
            self.coverage = self.coverage.index_select(0, rows)
            self.prev_penalty = self.prev_penalty.index_select(0, sentences)
        self.finished = [self.finished[i] for i in sentences.tolist()]
        self.best = [self.best[i] for i in sentences.tolist()]
        self.sentences = [self.sentences[i] for i in sentences.tolist()]
        if self.born is not None:
            self.born = [self.born[i] for i in sentences.tolist()]
            self.max_lengths = [self.max_lengths[i] for i in sentences.tolist()]
