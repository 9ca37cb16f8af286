"""Beam: the beam search of one sentence, step by step (OpenNMT-py 3.5.1 semantics)."""
from typing import List, Optional, Tuple

import torch

from onmt_lite.constants import FINISHED_SCORE
from onmt_lite.search.global_scorer import GNMTGlobalScorer
from onmt_lite.search.processors import NgramBlocker


class Beam:
    """``size`` hypotheses of one sentence.

    Each step keeps the ``size`` best extensions over all hypotheses (the first step extends
    only hypothesis 0). A hypothesis that ends in ``</s>`` is recorded in ``finished`` with its
    penalised score and keeps its slot for that step; its running score then becomes
    FINISHED_SCORE so that the next step replaces it. The search is done at a step where the
    top candidate ends in ``</s>`` (``eos_top``) and ``n_best`` hypotheses are finished; at
    ``max_length`` every hypothesis is finished.
    """

    def __init__(self, size: int, pad: int, bos: int, eos: int, n_best: int = 1,
                 global_scorer: Optional[GNMTGlobalScorer] = None, min_length: int = 0,
                 stepwise_penalty: bool = False, block_ngram_repeat: int = 0,
                 exclusion_tokens: frozenset = frozenset(), max_length: Optional[int] = None):
        self.size, self.pad, self.bos, self.eos, self.n_best = size, pad, bos, eos, n_best
        self.scorer = global_scorer or GNMTGlobalScorer()
        self.min_length, self.max_length = min_length, max_length
        self.stepwise_penalty = stepwise_penalty and self.scorer.has_cov_pen
        self.scores = torch.full((size,), float("-inf"))  # running log-probs
        self.scores[0] = 0.0
        self.all_scores: List[torch.Tensor] = []  # penalised candidate scores per step
        self.prev_ks: List[torch.Tensor] = []  # back-pointers per step
        self.next_ys = [torch.full((size,), bos, dtype=torch.long)]  # tokens per step
        self.attn: List[torch.Tensor] = []  # (size, src_len) per step
        self.finished: List[Tuple[float, int, int]] = []  # (score, timestep, k)
        self.eos_top = False
        self.coverage: Optional[torch.Tensor] = None
        self.prev_penalty: Optional[torch.Tensor] = None
        self.blocker = (NgramBlocker(block_ngram_repeat, size, bos, exclusion_tokens)
                        if block_ngram_repeat > 0 else None)
        self._done = False

    def get_current_state(self) -> torch.Tensor:
        """The tokens chosen at the last step, (size,)."""
        return self.next_ys[-1]

    def get_current_origin(self) -> torch.Tensor:
        """The back-pointers of the last step, (size,)."""
        return self.prev_ks[-1]

    def done(self) -> bool:
        return self._done

    def advance(self, word_logprobs: torch.Tensor, attn_out: torch.Tensor) -> None:
        """Extends the beam with next-token log-probs (size, V) and attention (size, src_len)."""
        vocab_size = word_logprobs.size(1)
        step = len(self.next_ys)  # prefix length, <s> included
        if self.stepwise_penalty and self.prev_penalty is not None:
            self.scores = (self.scores + self.prev_penalty
                           - self.scorer.cov_penalty(self.coverage + attn_out))
        log_probs = word_logprobs.float().clone()
        if step <= self.min_length:
            log_probs[:, self.eos] = FINISHED_SCORE
        log_probs += self.scores.unsqueeze(1)
        length_penalty = self.scorer.length_penalty(step + 1)  # +1: the </s> that may follow
        curr = log_probs / length_penalty if length_penalty != 1 else log_probs
        if self.blocker:
            self.blocker.block(curr)
        top_scores, ids = curr.view(-1).topk(self.size)
        self.scores = top_scores * length_penalty
        prev_k = torch.div(ids, vocab_size, rounding_mode="floor")
        ys = ids - prev_k * vocab_size
        self.prev_ks.append(prev_k)
        self.next_ys.append(ys)
        if self.blocker:
            self.blocker.update(prev_k.tolist(), ys.tolist())
        current_attn = attn_out.index_select(0, prev_k)
        self.attn.append(current_attn)
        if self.scorer.has_cov_pen:
            if self.coverage is None:
                self.coverage = current_attn
                self.prev_penalty = torch.zeros_like(self.scores)
            else:
                self.coverage = self.coverage.index_select(0, prev_k) + current_attn
                self.prev_penalty = self.scorer.cov_penalty(self.coverage)
            if not self.stepwise_penalty:
                top_scores = top_scores - self.scorer.cov_penalty(self.coverage)
        self.all_scores.append(top_scores)
        self._record_finished(ys, top_scores)

    def _record_finished(self, ys: torch.Tensor, top_scores: torch.Tensor) -> None:
        at_max_length = self.max_length is not None and len(self.next_ys) == self.max_length + 1
        ended = torch.ones_like(ys, dtype=torch.bool) if at_max_length else ys.eq(self.eos)
        timestep = len(self.next_ys) - 1
        for k in ended.nonzero().view(-1).tolist():
            self.finished.append((top_scores[k].item(), timestep, k))
        self.scores = self.scores.masked_fill(ended, FINISHED_SCORE)
        self.eos_top = bool(ys[0] == self.eos)
        self._done = (self.eos_top or at_max_length) and len(self.finished) >= self.n_best

    def sort_finished(self, minimum: Optional[int] = None) -> Tuple[List[float], List[Tuple[int, int]]]:
        """Finished hypotheses, best first (ties keep finishing order).

        With ``minimum``, live hypotheses are added (at the last step) until there are that many.
        Returns scores and (timestep, k) pairs for ``get_hyp``.
        """
        if minimum is not None:
            last = len(self.next_ys) - 1
            done_now = {k for _, t, k in self.finished if t == last}
            for k in range(self.size):
                if len(self.finished) >= minimum:
                    break
                if k not in done_now:
                    self.finished.append((self.all_scores[-1][k].item(), last, k))
        ranked = sorted(self.finished, key=lambda f: f[0], reverse=True)
        return [s for s, _, _ in ranked], [(t, k) for _, t, k in ranked]

    def get_hyp(self, timestep: int, k: int) -> Tuple[List[int], torch.Tensor]:
        """Walks the back-pointers from hypothesis ``k`` at ``timestep``.

        Returns the tokens (without ``<s>``) and the attention (timestep, src_len).
        """
        tokens, attn = [], []
        for j in range(timestep - 1, -1, -1):
            tokens.append(int(self.next_ys[j + 1][k]))
            attn.append(self.attn[j][k])
            k = int(self.prev_ks[j][k])
        return tokens[::-1], torch.stack(attn[::-1])
