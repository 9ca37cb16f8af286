"""Greedy decoding and random sampling, batched: the fast path for ``-beam_size 1``.

Greedy search gives what a beam of one gives (same scores, same length rules).
"""
from dataclasses import dataclass
from typing import List, Optional

import torch

from onmt_lite.constants import FINISHED_SCORE
from onmt_lite.translate.global_scorer import GNMTGlobalScorer
from onmt_lite.translate.ngram_blocker import NgramBlocker


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


def greedy_search(model, src, src_len, *, bos: int, eos: int, max_length: int,
                  min_length: int = 0, scorer: GNMTGlobalScorer = None,
                  block_ngram_repeat: int = 0, exclusion_tokens: frozenset = frozenset(),
                  sampler: Optional[Sampler] = None,
                  forced_eos: bool = False) -> List[Hypothesis]:
    """Decodes a batch token by token; finished sentences leave the batch.

    Args:
        src: (B, S) source ids; src_len: (B,) lengths.
    Returns:
        one Hypothesis per sentence, in batch order.
    """
    scorer = scorer or GNMTGlobalScorer()
    batch = src.size(0)
    memory, final = model.encode(src, src_len)
    model.decoder.init_state(src_len, memory, final)
    live = torch.arange(batch)  # original index of each decoder row
    tokens = torch.full((batch,), bos, dtype=torch.long, device=src.device)
    scores = torch.zeros(batch, device=src.device)
    seqs = [[bos] for _ in range(batch)]
    attns: List[List[torch.Tensor]] = [[] for _ in range(batch)]
    coverage = None
    blocker = (NgramBlocker(block_ngram_repeat, batch, bos, exclusion_tokens)
               if block_ngram_repeat > 0 else None)
    results: List[Optional[Hypothesis]] = [None] * batch
    for step in range(1, max_length + 1):  # step = prefix length, <s> included
        out, attn = model.decoder.step(tokens)
        log_probs = model.log_probs(out)
        if step <= min_length:
            log_probs[:, eos] = FINISHED_SCORE
        if forced_eos and step == max_length:
            force_eos(log_probs, eos)
        lp = scorer.length_penalty(step + 1)
        curr = (log_probs + scores.unsqueeze(1)) / lp if lp != 1 else log_probs + scores.unsqueeze(1)
        if blocker:
            blocker.block(curr)
        if sampler is None:
            top, tokens = curr.max(dim=1)
        else:
            tokens = sampler.pick(log_probs)
            top = curr.gather(1, tokens.unsqueeze(1)).squeeze(1)
        scores = top * lp
        if blocker:
            blocker.update(range(len(live)), tokens.tolist())
        if scorer.has_cov_pen:
            coverage = attn if coverage is None else coverage + attn
            padded = torch.arange(attn.size(1), device=src.device) >= src_len[live].unsqueeze(1)
            top = top - scorer.cov_penalty(coverage.masked_fill(padded, 1.0))  # padding: no penalty
        ended = tokens.eq(eos) | (step == max_length)
        keep = []
        for row, (i, tok) in enumerate(zip(live.tolist(), tokens.tolist())):
            seqs[i].append(tok)
            attns[i].append(attn[row, :int(src_len[i])])
            if ended[row]:
                results[i] = Hypothesis(seqs[i][1:], top[row].item(), torch.stack(attns[i]))
            else:
                keep.append(row)
        if not keep:
            break
        if len(keep) < len(live):
            rows = torch.tensor(keep, device=src.device)
            live, tokens, scores = live[keep], tokens[rows], scores[rows]
            coverage = coverage.index_select(0, rows) if coverage is not None else None
            if blocker:
                blocker.keep(keep)
            model.decoder.map_state(lambda state, dim: state.index_select(dim, rows))
    return results

