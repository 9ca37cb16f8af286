"""Batched beam search: every sentence of a batch advances with a few tensor operations a step.

Same semantics, scores and results as one Beam per sentence (see beam.py); only bookkeeping of
finished hypotheses touches Python lists, and only at steps where some hypothesis ends. Greedy
search and random sampling (sampling.py) are this loop with one hypothesis per sentence.
"""
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch

from onmt_lite.constants import FINISHED_SCORE
from onmt_lite.translate.global_scorer import GNMTGlobalScorer
from onmt_lite.translate.ngram_blocker import NgramBlocker
from onmt_lite.translate.sampling import Sampler


@dataclass
class Hypothesis:
    tokens: List[int]  # without <s>, with </s> if it ended so
    score: float
    attn: torch.Tensor  # (len(tokens), src_len)


def force_eos(log_probs: torch.Tensor, eos: int) -> None:
    """</s> as the only choice, with log-probability 0 (Hugging Face's forced_eos_token_id at
    the last step)."""
    log_probs.fill_(float("-inf"))
    log_probs[:, eos] = 0.0


def beam_search(model, src: torch.Tensor, src_len: torch.Tensor, *, beam_size: int, bos: int,
                eos: int, max_length: int, n_best: int = 1, min_length: int = 0,
                scorer: Optional[GNMTGlobalScorer] = None, stepwise_penalty: bool = False,
                block_ngram_repeat: int = 0, exclusion_tokens: frozenset = frozenset(),
                forced_eos: bool = False,
                sampler: Optional[Sampler] = None) -> List[List[Hypothesis]]:
    """Beam search over a batch; finished sentences leave the decoder state.

    Args:
        src: (B, S) source ids; src_len: (B,) lengths.
        sampler: with ``beam_size`` 1, draws each token from the step's distribution instead
            of taking the best.
    Returns:
        for each sentence, its ``n_best`` hypotheses, best first.
    """
    scorer = scorer or GNMTGlobalScorer()
    stepwise = stepwise_penalty and scorer.has_cov_pen
    k, batch, dec, device = beam_size, src.size(0), model.decoder, src.device
    # a. Encode once. The first step extends hypothesis 0 only, so it runs on one row per
    # sentence; then every state row is repeated k times (rows are sentence-major: b * k + j).
    memory, final = model.encode(src, src_len)
    dec.init_state(src_len, memory, final)
    live = list(range(batch))  # original sentence of each block of k rows
    scores = torch.full((batch, k), float("-inf"), device=device)  # running log-probs
    scores[:, 0] = 0.0  # the first step extends hypothesis 0 only
    seqs = torch.full((batch * k, 1), bos, dtype=torch.long, device=device)  # (rows, t)
    attn_hist = None  # (rows, t, S)
    padding = (torch.arange(src.size(1), device=device) >= src_len.unsqueeze(1)
               ).repeat_interleave(k, dim=0)  # (rows, S)
    lengths = src_len.tolist()
    coverage = prev_penalty = None
    blocker = (NgramBlocker(block_ngram_repeat, batch * k, bos, exclusion_tokens)
               if block_ngram_repeat > 0 else None)
    finished: Dict[int, list] = {b: [] for b in range(batch)}
    results: List[Optional[List[Hypothesis]]] = [None] * batch

    def cov_penalty(cov):  # padded positions count as fully covered: no penalty
        return scorer.cov_penalty(cov.masked_fill(padding, 1.0))

    for step in range(1, max_length + 1):  # step = prefix length, <s> included
        n = len(live)
        # b. One decoder step for all live hypotheses.
        if step == 1 and k > 1:
            out, attn = dec.step(seqs[::k, -1])
            dec.map_state(lambda state, dim: state.repeat_interleave(k, dim=dim))
            out, attn = out.repeat_interleave(k, dim=0), attn.repeat_interleave(k, dim=0)
        else:
            out, attn = dec.step(seqs[:, -1])
        log_probs = model.log_probs(out)  # (n * k, V)
        attn = attn.float()
        vocab = log_probs.size(1)
        if stepwise and prev_penalty is not None:
            scores = scores + prev_penalty - cov_penalty(coverage + attn).view(n, k)
        # c. Candidate scores: min length, running score, length penalty, n-gram blocking.
        if step <= min_length:
            log_probs[:, eos] = FINISHED_SCORE
        if forced_eos and step == max_length:
            force_eos(log_probs, eos)
        allowed = None if sampler is None else log_probs.clone()  # what a sample draws from
        curr = log_probs.add_(scores.view(-1, 1))  # in place: no new (rows, V) buffer
        length_penalty = scorer.length_penalty(step + 1)  # +1: the </s> that may follow
        if length_penalty != 1:
            curr.div_(length_penalty)
        if blocker:
            blocker.block(curr)
            if allowed is not None:
                blocker.block(allowed)
        # d. The k best of each sentence's k * V candidates; their origins and tokens.
        if sampler is None:
            top_scores, ids = top_candidates(curr.view(n, k, vocab), k)  # (n, k)
        else:
            ids = sampler.pick(allowed).view(n, 1)
            top_scores = curr.gather(1, ids)
        scores = top_scores * length_penalty
        origin = torch.div(ids, vocab, rounding_mode="floor")
        tokens = ids - origin * vocab
        select = (origin + torch.arange(n, device=device).unsqueeze(1) * k).view(-1)  # (n*k,)
        seqs = torch.cat([seqs.index_select(0, select), tokens.view(-1, 1)], dim=1)
        current_attn = attn.index_select(0, select)
        attn_hist = current_attn.unsqueeze(1) if attn_hist is None else torch.cat(
            [attn_hist.index_select(0, select), current_attn.unsqueeze(1)], dim=1)
        if blocker:
            blocker.update(select.tolist(), tokens.view(-1).tolist())
        # e. Coverage follows the chosen paths.
        if scorer.has_cov_pen:
            if coverage is None:
                coverage, prev_penalty = current_attn, torch.zeros_like(scores)
            else:
                coverage = coverage.index_select(0, select) + current_attn
                prev_penalty = cov_penalty(coverage).view(n, k)
            if not stepwise:
                top_scores = top_scores - cov_penalty(coverage).view(n, k)
        # f. Record finished hypotheses; a sentence is done when its top candidate ended.
        ended = tokens.eq(eos) if step < max_length else torch.ones_like(tokens, dtype=torch.bool)
        keep = list(range(n))
        if bool(ended.any()):
            scores = scores.masked_fill(ended, FINISHED_SCORE)
            ended_rows, top = ended.tolist(), top_scores.tolist()
            keep = []
            for i, b in enumerate(live):
                for j in (j for j in range(k) if ended_rows[i][j]):
                    row = i * k + j
                    finished[b].append((top[i][j], seqs[row, 1:],
                                        attn_hist[row, :, :lengths[b]]))
                if ended_rows[i][0] and len(finished[b]) >= n_best:
                    ranked = sorted(finished[b], key=lambda f: f[0], reverse=True)[:n_best]
                    results[b] = [Hypothesis(t.tolist(), s, a) for s, t, a in ranked]
                else:
                    keep.append(i)
            if not keep:
                break
        # g. Reorder the decoder state by the chosen origins, dropping finished sentences.
        if len(keep) < n:
            keep = fill_gaps(keep)
            rows = torch.tensor([i * k + j for i in keep for j in range(k)], device=device)
            live = [live[i] for i in keep]
            keep_t = torch.tensor(keep, device=device)
            scores, select = scores.index_select(0, keep_t), select.index_select(0, rows)
            seqs, attn_hist = seqs.index_select(0, rows), attn_hist.index_select(0, rows)
            padding = padding.index_select(0, rows)
            if coverage is not None:
                coverage = coverage.index_select(0, rows)
                prev_penalty = prev_penalty.index_select(0, keep_t)
            if blocker:
                blocker.keep(rows.tolist())
        if k > 1 or len(keep) < n:  # one hypothesis per sentence stays where it is
            dec.map_state(lambda state, dim: state.index_select(dim, select))
    return results


def fill_gaps(keep: List[int]) -> List[int]:
    """The sentences ``keep`` in a new order: those below ``len(keep)`` keep their place, the
    others fill the places of sentences that left, so the decoder's cache moves only those."""
    kept, movers = set(keep), iter(i for i in keep if i >= len(keep))
    return [i if i in kept else next(movers) for i in range(len(keep))]


def top_candidates(curr: torch.Tensor, k: int,
                   group: int = 8) -> Tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest of each sentence's candidates: ``topk`` over its rows * V, faster
    (equal values may come in another order).

    A token of the top k lies in one of its row's k best groups (tokens v, v + V/group, ...,
    ranked by their maximum), so only those k * group tokens per row are ranked in full.

    Args:
        curr: (n, rows, V) candidate scores.
    Returns:
        values (n, k), best first, and indices (n, k) into the flattened rows * V.
    """
    n, rows, vocab = curr.shape
    width = vocab // group
    if vocab % group or width < k:
        return curr.reshape(n, rows * vocab).topk(k, dim=1)
    grouped = curr.view(n * rows, group, width)
    best_groups = grouped.amax(1).topk(k, dim=1).indices  # (n * rows, k)
    members = grouped.gather(2, best_groups.unsqueeze(1).expand(-1, group, k))  # (n*rows, group, k)
    values, picked = members.view(n, rows * group * k).topk(k, dim=1)
    row = torch.div(picked, group * k, rounding_mode="floor")
    member = torch.div(picked % (group * k), k, rounding_mode="floor")
    column = best_groups.view(n, rows * k).gather(1, row * k + picked % k)
    return values, row * vocab + member * width + column
