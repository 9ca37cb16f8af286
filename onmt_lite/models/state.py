"""Decoder state shared by both model types: a dict of tensors that map_state reorders.

Source-side entries (encoder memory, its projections, the source mask) are the same for every
hypothesis of a sentence. A ``sentence`` entry records which sentence each row belongs to; when a
reorder leaves every row in its own sentence (the usual beam step), those entries are not copied.
"""
from typing import Callable, Dict, Iterable

import torch

StateFn = Callable[[torch.Tensor, int], torch.Tensor]


def new_state(batch: int, device) -> Dict[str, torch.Tensor]:
    return {"sentence": torch.arange(batch, device=device)}


def same_sentences(before: torch.Tensor, after: torch.Tensor) -> bool:
    """Whether a reorder left every row in its sentence (the usual beam step)."""
    return before.shape == after.shape and torch.equal(before, after)


def map_state(state: Dict[str, torch.Tensor], fn: StateFn, dims: Dict[str, int],
              source_keys: Iterable[str]) -> Dict[str, torch.Tensor]:
    """``fn(tensor, batch_dim)`` on every entry; source entries only when rows change sentence.

    ``dims`` gives the batch dimension of entries that are not batch-first.
    """
    sentence = fn(state["sentence"], 0)
    unchanged = same_sentences(state["sentence"], sentence)
    source = set(source_keys)
    return {key: value if unchanged and key in source else
            sentence if key == "sentence" else fn(value, dims.get(key, 0))
            for key, value in state.items()}
