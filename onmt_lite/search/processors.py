"""Processors: small objects that edit one step's scores, (rows, V), before candidates are chosen.

Each is called as ``processor(scores, step, history)`` where ``step`` is the prefix length
(``<s>`` included) and ``history`` the (rows, step) token ids of the hypotheses, ``<s>`` first.
A processor that keeps per-row state follows the hypotheses through ``advance`` (row r becomes
row ``origins[r]`` extended by ``tokens[r]``) and ``keep`` (rows of sentences that stay).
"""
from typing import Dict, List, Sequence, Set

import torch

from onmt_lite.constants import BLOCKED_SCORE

NEG_INF = float("-inf")


class Processor:
    stateful = False  # keeps per-row state: follows advance and keep
    step_free = False  # reads neither the step nor the history (rows may be at steps of their own)

    def __call__(self, scores: torch.Tensor, step: int, history: torch.Tensor) -> None:
        raise NotImplementedError

    def acts(self, step: int) -> bool:
        """Whether it may change the scores at ``step`` (one that acts at a few steps only says
        which: the other steps need no logits of their own)."""
        return True

    def advance(self, origins: Sequence[int], tokens: Sequence[int]) -> None:
        pass

    def keep(self, rows: Sequence[int]) -> None:
        pass


class MinLength(Processor):
    """``</s>`` gets ``value`` while fewer than ``min_length`` tokens precede it."""

    def __init__(self, min_length: int, eos: int, value: float):
        self.min_length, self.eos, self.value = min_length, eos, value

    def __call__(self, scores, step, history):
        if self.acts(step):
            scores[:, self.eos] = self.value

    def acts(self, step):
        return step <= self.min_length


class BanToken(Processor):
    """A token never generated, with score ``value`` (OpenNMT-py's ``-ban_unk_token``)."""
    step_free = True

    def __init__(self, token: int, value: float):
        self.token, self.value = token, value

    def __call__(self, scores, step, history):
        scores[:, self.token] = self.value


class TargetPrefix(Processor):
    """OpenNMT-py's ``-tgt_file_prefix``: while a row's prefix lasts, every token but the
    prefix's next one loses PREFIX_PENALTY from its candidate score; a row whose prefix has
    ended (``</s>`` or padding) is free.

    Args:
        prefixes: (rows, P) token ids of each row's prefix, then ``</s>``, then ``pad``.
    """
    stateful = True
    PREFIX_PENALTY = 10000.0

    def __init__(self, prefixes: torch.Tensor, eos: int, pad: int):
        self.prefixes, self.eos, self.pad = prefixes, eos, pad

    def __call__(self, scores, step, history):
        if step > self.prefixes.size(1):
            return
        wanted = self.prefixes[:, step - 1]  # (rows,)
        free = wanted.eq(self.eos) | wanted.eq(self.pad)
        penalty = torch.full_like(scores, self.PREFIX_PENALTY)
        penalty.scatter_(1, wanted.unsqueeze(1), 0.0)
        scores.sub_(penalty.masked_fill_(free.unsqueeze(1), 0.0))

    def advance(self, origins, tokens):
        self.prefixes = self.prefixes.index_select(
            0, torch.tensor(origins, device=self.prefixes.device))

    def keep(self, rows):
        self.prefixes = self.prefixes.index_select(
            0, torch.tensor(rows, device=self.prefixes.device))


class ForcedEOS(Processor):
    """``</s>`` as the only choice at the last step: with log-probability 0 (Hugging Face's
    ``forced_eos_token_id``) or, ``keep_score``, its own (fairseq's last step)."""

    def __init__(self, max_length: int, eos: int, keep_score: bool = False):
        self.max_length, self.eos, self.keep_score = max_length, eos, keep_score

    def acts(self, step):
        return step == self.max_length

    def __call__(self, scores, step, history):
        if self.acts(step):
            if self.keep_score:
                scores[:, :self.eos] = NEG_INF
                scores[:, self.eos + 1:] = NEG_INF
            else:
                force_eos(scores, self.eos)


def force_eos(scores: torch.Tensor, eos: int) -> None:
    scores.fill_(NEG_INF)
    scores[:, eos] = 0.0


class BannedTokens(Processor):
    """Tokens never generated (Hugging Face's single-token ``bad_words_ids``). ``renormalise``:
    the other tokens' log-probabilities sum to 1 again, as when the ban acts on logits (greedy
    ``generate``); Hugging Face's beam search bans after the softmax and does not."""
    step_free = True

    def __init__(self, ids: Sequence[int], renormalise: bool):
        self.ids, self.renormalise = list(ids), renormalise

    def __call__(self, scores, step, history):
        scores[:, self.ids] = NEG_INF
        if self.renormalise:
            scores.copy_(torch.log_softmax(scores, dim=-1))


class Renormalise(Processor):
    """Log-probabilities that sum to 1 again after the other processors (Hugging Face's
    ``renormalize_logits``)."""
    step_free = True

    def __call__(self, scores, step, history):
        scores.copy_(torch.log_softmax(scores, dim=-1))


class Warper(Processor):
    """Hugging Face's sampling warpers, in its order: divide by ``temperature``, keep the
    ``top_k`` best (0: all) and the smallest set whose probability reaches ``top_p`` (0 or 1:
    all), never fewer than ``min_keep`` tokens; the others get -inf."""

    def __init__(self, temperature: float, top_k: int, top_p: float, min_keep: int):
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.min_keep = min_keep

    def __call__(self, scores, step, history):
        if self.temperature != 1.0:
            scores.div_(self.temperature)
        if self.top_k > 0:
            k = min(max(self.top_k, self.min_keep), scores.size(1))
            scores.masked_fill_(scores < scores.topk(k, dim=1).values[:, -1:], NEG_INF)
        if 0 < self.top_p < 1:
            ascending, order = scores.sort(dim=1)
            drop = ascending.softmax(1).cumsum(1) <= 1 - self.top_p
            drop[:, -self.min_keep:] = False
            scores.masked_fill_(drop.scatter(1, order, drop), NEG_INF)


class RepetitionPenalty(Processor):
    """The ``repetition_penalty`` of Hugging Face and CTranslate2 (CTRL's): a token already in
    the hypothesis has its score multiplied by ``penalty`` where negative, divided where
    positive. ``count_start``: the decoder's start token counts (Hugging Face)."""

    def __init__(self, penalty: float, count_start: bool = True):
        self.penalty, self.first = penalty, 0 if count_start else 1

    def __call__(self, scores, step, history):
        history = history[:, self.first:]
        if history.size(1) == 0:
            return
        seen = scores.gather(1, history)
        seen = torch.where(seen < 0, seen * self.penalty, seen / self.penalty)
        scores.scatter_(1, history, seen)


class NoRepeatNgram(Processor):
    """``no_repeat_ngram_size`` (Hugging Face, fairseq, CTranslate2): a token that would
    complete an n-gram already in the hypothesis gets -inf. ``count_start``: the decoder's start
    token counts (Hugging Face)."""

    def __init__(self, n: int, count_start: bool = True):
        self.n, self.first = n, 0 if count_start else 1

    def __call__(self, scores, step, history):
        history = history[:, self.first:]
        n = self.n
        if history.size(1) + 1 < n:
            return
        for row, seq in enumerate(history.tolist()):
            prefix = tuple(seq[len(seq) - n + 1:]) if n > 1 else ()
            banned = {seq[i + n - 1] for i in range(len(seq) - n + 1)
                      if tuple(seq[i:i + n - 1]) == prefix}
            if banned:
                scores[row, list(banned)] = NEG_INF


class NgramBlocker(Processor):
    """OpenNMT-py's ``block_ngram_repeat``: forbids tokens that would repeat an n-gram of a
    hypothesis, with BLOCKED_SCORE on the candidate scores.

    Each hypothesis row keeps its token sequence and a table {(n-1)-gram: next tokens seen};
    n-grams that touch an exempt token are not recorded.
    """

    stateful = True

    def __init__(self, n: int, rows: int, bos: int, exempt: frozenset = frozenset()):
        self.n, self.exempt = n, exempt
        self.seqs: List[List[int]] = [[bos] for _ in range(rows)]
        self.tables: List[Dict[tuple, Set[int]]] = [dict() for _ in range(rows)]

    def _key(self, seq: List[int]) -> tuple:
        return tuple(seq[len(seq) - (self.n - 1):]) if self.n > 1 else ()

    def __call__(self, scores, step=None, history=None):
        self.block(scores)

    def block(self, scores: torch.Tensor) -> None:
        """Sets BLOCKED_SCORE on the tokens each row (scores (rows, V)) must not produce."""
        if len(self.seqs[0]) < self.n:
            return
        for row, (seq, table) in enumerate(zip(self.seqs, self.tables)):
            banned = table.get(self._key(seq))
            if banned:
                scores[row, list(banned)] = BLOCKED_SCORE

    def advance(self, origins: Sequence[int], tokens: Sequence[int]) -> None:
        seqs, tables = [], []
        for origin, token in zip(origins, tokens):
            seq = self.seqs[origin] + [token]
            table = {key: set(next_tokens) for key, next_tokens in self.tables[origin].items()}
            ngram = seq[-self.n:]
            if len(seq) >= self.n and not set(ngram) & self.exempt:
                table.setdefault(tuple(ngram[:-1]), set()).add(ngram[-1])
            seqs.append(seq)
            tables.append(table)
        self.seqs, self.tables = seqs, tables

    update = advance  # the name Beam uses

    def keep(self, rows: Sequence[int]) -> None:
        self.seqs = [self.seqs[r] for r in rows]
        self.tables = [self.tables[r] for r in rows]
