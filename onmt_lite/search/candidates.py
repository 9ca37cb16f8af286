"""Candidate selection: which continuations of a step's hypotheses survive it.

``TopK`` keeps the best ``width`` of each sentence's rows x V candidates; ``Sampler`` draws
one token per hypothesis instead (random sampling with top-k, nucleus and temperature).
"""
from dataclasses import dataclass
from typing import Optional, Tuple

import torch


@dataclass(frozen=True)
class TopK:
    """The ``width`` best candidates of each sentence: ``beam_size`` (OpenNMT-py) or
    2 x ``beam_size`` (fairseq, Hugging Face, CTranslate2, TensorFlow: enough to refill the beam
    when some end). ``exact``: plain ``topk`` order among equal scores, as Hugging Face takes.
    ``lowest_first``: equal scores in index order (CTranslate2's greedy search)."""
    width_factor: int = 1
    exact: bool = False
    lowest_first: bool = False

    def pick(self, scores: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """(n, k, V) candidate scores -> values (n, width), best first, and indices (n, width)
        into the flattened k * V."""
        width = min(self.width_factor * k, scores.size(1) * scores.size(2))
        if self.lowest_first:
            values, ids = scores.reshape(scores.size(0), -1).sort(dim=1, descending=True, stable=True)
            return values[:, :width], ids[:, :width]
        if self.exact:
            return exact_top(scores, width)
        return top_candidates(scores, width)


@dataclass(frozen=True)
class Argmax:
    """The best candidate of each sentence of one hypothesis, the lowest token id among equal
    scores: Hugging Face's greedy ``torch.argmax(next_token_scores, dim=-1)``
    (transformers/generation/utils.py, ``_sample``); ``topk`` may take another of them."""

    def pick(self, scores: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
        flat = scores.reshape(scores.size(0), -1)
        ids = flat.argmax(1, keepdim=True)
        return flat.gather(1, ids), ids


@dataclass
class BeamSampler:
    """Beam sampling (Hugging Face ``do_sample`` with ``num_beams``): each sentence draws its
    2 x ``beam_size`` candidates without replacement, in proportion to the softmax of their
    scores, in the order drawn."""
    generator: Optional[torch.Generator] = None

    def pick(self, scores: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
        flat = scores.reshape(scores.size(0), -1)
        ids = torch.multinomial(flat.softmax(1), 2 * k, generator=self.generator)
        return flat.gather(1, ids), ids


@dataclass
class Sampler:
    """Random sampling: keep the ``topk`` best tokens (0 = all) or the smallest set whose
    probability reaches ``topp`` (0 = off), divide the logits by ``temperature``, sample."""
    topk: int = 0
    topp: float = 0.0
    temperature: float = 1.0
    generator: Optional[torch.Generator] = None

    def draw(self, log_probs: torch.Tensor) -> torch.Tensor:
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
    if vocab % group or vocab // group < k:
        return curr.reshape(n, rows * vocab).topk(k, dim=1)
    _, values, ids = _by_groups(curr, k, group)
    return values, ids


def _by_groups(curr: torch.Tensor, k: int, group: int, spare: int = 0):
    """The ``k + spare`` best tokens of each sentence among those of its rows' k best groups
    (see top_candidates): each row's ``k + spare`` best group maxima (n * rows, k + spare), and
    the tokens' values and indices into rows * V (n, k + spare), best first."""
    n, rows, vocab = curr.shape
    width, ranked = vocab // group, k + spare
    grouped = curr.view(n * rows, group, width)
    maxima, best_groups = grouped.amax(1).topk(ranked, dim=1)
    best_groups = best_groups[:, :k]
    members = grouped.gather(2, best_groups.unsqueeze(1).expand(-1, group, k))  # (n*rows, group, k)
    values, picked = members.view(n, rows * group * k).topk(ranked, dim=1)
    row = torch.div(picked, group * k, rounding_mode="floor")
    member = torch.div(picked % (group * k), k, rounding_mode="floor")
    column = best_groups.reshape(n, rows * k).gather(1, row * k + picked % k)
    return maxima, values, row * vocab + member * width + column


EXACT_TOPK_BELOW = 1 << 16


def exact_top(curr: torch.Tensor, k: int, group: int = 8) -> Tuple[torch.Tensor, torch.Tensor]:
    """``topk`` over each sentence's rows * V, its very values and indices, ranked as
    top_candidates ranks them wherever that gives the same (1.2-2x faster at 16-64 rows of
    8,000), else by ``topk`` itself (below EXACT_TOPK_BELOW candidates in all, its own pass is
    as fast: a lone sentence).

    The same whenever, in each row, the k + 1-th best group's maximum is below the k-th's (every
    token at least the sentence's k-th best then lies in its row's k best groups) and the k + 1
    best candidates ranked are all different: the k best are then the only k best, in the only
    order. Equal scores anywhere near the top (or a row of -inf) fall back to ``topk``.

    Args:
        curr: (n, rows, V) candidate scores.
    Returns:
        values (n, k), best first, and indices (n, k) into the flattened rows * V.
    """
    n, rows, vocab = curr.shape
    if vocab % group or vocab // group < k + 1 or n * rows * vocab < EXACT_TOPK_BELOW \
            or curr.device.type != "cpu":  # its check would wait for a GPU at every step
        return curr.reshape(n, rows * vocab).topk(k, dim=1)
    maxima, values, ids = _by_groups(curr, k, group, spare=1)
    if not bool(((maxima[:, k - 1] > maxima[:, k]).all()
                 & (values[:, :-1] > values[:, 1:]).all())):
        return curr.reshape(n, rows * vocab).topk(k, dim=1)
    return values[:, :k], ids[:, :k]
