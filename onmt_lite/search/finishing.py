"""Finishing rules: how candidates are ranked, which end, which go on, and when a sentence is done.

Both rules keep ``k`` running hypotheses per sentence, rows sentence-major (row = i * k + j).

- ``OnmtSlots`` (OpenNMT-py): the ``k`` best candidates by length-penalised score all stay; one
  that ends in ``</s>`` is recorded and holds its slot for that step. A sentence is done when
  its top candidate ends and ``n_best`` hypotheses are finished.
- ``RefillBeams`` (Hugging Face ``generate``): ranks by summed log-probability, takes 2k
  candidates; an ending candidate among the first k enters a k-slot finished list (score
  divided by generated length ** alpha, ``</s>`` counted); the k best non-ending candidates run
  on. ``early_stopping``: ``true`` stops when k hypotheses are finished; ``false`` when the best
  running hypothesis, normalised by the current length, cannot beat the worst finished one;
  ``never`` the same bound at ``max_length`` when alpha > 0.
"""
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch.nn import functional as F

from onmt_lite.constants import FINISHED_SCORE
from onmt_lite.errors import OptionError
from onmt_lite.search.global_scorer import GNMTGlobalScorer

HF_EXCLUDED = -1.0e9  # Hugging Face's additive mask for beams that may not be chosen
CT2_PENALISED = -1.0e10  # CTranslate2's score for what a target prefix rules out


@dataclass
class Hypothesis:
    tokens: List[int]  # without <s>, with </s> if it ended so
    score: float
    attn: torch.Tensor  # (len(tokens), src_len)


# (candidate row) -> (token ids without <s>, attention (len, src_len)) of that candidate
CandidatePath = Callable[[int], Tuple[torch.Tensor, torch.Tensor]]


class OnmtSlots:
    """OpenNMT-py's beam search (see the module docstring), with GNMTGlobalScorer penalties."""
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
        _take_finished(self.slots, chosen, width, path)
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
                done[i] = [_finished(slot, score) for slot, score
                           in zip(self.slots[i][:self.n_best], scores[i][:self.n_best])]
        return going_on, done

    def keep(self, sentences: torch.Tensor, rows: torch.Tensor) -> None:
        self.running = self.running.index_select(0, sentences)
        self.best = self.best.index_select(0, sentences)
        self.is_finished = self.is_finished.index_select(0, sentences)
        self.improvable = self.improvable.index_select(0, sentences)
        self.slots = [self.slots[i] for i in sentences.tolist()]


def _take_finished(slots: List[list], chosen: torch.Tensor, width: int,
                   path: CandidatePath) -> None:
    """Each sentence's k finished slots after a merge: ``chosen`` (n, k) indexes the old slots
    (below k) and then the step's candidates (k and up)."""
    k = len(slots[0])
    unchanged = list(range(k))
    for i, picks in enumerate(chosen.tolist()):
        if picks != unchanged:
            slots[i] = [slots[i][j] if j < k else path(i * width + j - k) for j in picks]


def _finished(slot: Optional[tuple], score: float) -> Hypothesis:
    if slot is None:  # a slot no hypothesis reached (every candidate ended early)
        return Hypothesis([], score, torch.zeros(0, 0))
    tokens, attn = slot
    return Hypothesis(tokens.tolist(), score, attn)


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
        going_on = torch.arange(k, device=values.device).expand(n, k)
        done = {}
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
            _take_finished(self.slots, chosen, width, path)
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
                done[i] = [_finished(slot, score) for slot, score in list(pairs)[:self.n_best]]
        return going_on, done

    def keep(self, sentences: torch.Tensor, rows: torch.Tensor) -> None:
        self.alive = self.alive.index_select(0, sentences)
        self.scores = self.scores.index_select(0, sentences)
        self.flags = self.flags.index_select(0, sentences)
        self.slots = [self.slots[i] for i in sentences.tolist()]

