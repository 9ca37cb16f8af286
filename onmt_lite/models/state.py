"""Decoder state shared by both model types: a dict of tensors that map_state reorders.

Source-side entries (encoder memory, its projections, the source mask) are the same for every
hypothesis of a sentence, so they keep one row per sentence, shared by its ``group`` consecutive
decoder rows. A ``sentence`` entry records which sentence each row belongs to; when a reorder
leaves every row in its own sentence (the usual beam step), source entries are not touched.
"""
from typing import Callable, Dict, Iterable, NamedTuple

import torch

StateFn = Callable[[torch.Tensor, int], torch.Tensor]


def new_state(batch: int, device) -> Dict[str, torch.Tensor]:
    return {"sentence": torch.arange(batch, device=device)}


class Mapped(NamedTuple):
    state: Dict[str, torch.Tensor]
    group: int


def map_state(state: Dict[str, torch.Tensor], fn: StateFn, dims: Dict[str, int],
              source_keys: Iterable[str], group: int) -> Mapped:
    """``fn(tensor, batch_dim)``, a selection of rows, on every entry but the source entries.

    Source entries hold one row per ``group`` consecutive rows (a sentence's hypotheses); they
    are selected only when rows change sentence: per sentence while every sentence keeps the
    same number of rows (beam tiling, finished sentences leaving), else per row.
    ``dims`` gives the batch dimension of entries that are not batch-first.
    """
    sentence = fn(state["sentence"], 0)
    source = set(source_keys)
    moved = {key: sentence if key == "sentence" else fn(value, dims.get(key, 0))
             for key, value in state.items() if key not in source}
    before = state["sentence"]
    if sentence.shape == before.shape and torch.equal(sentence, before):
        return Mapped({**state, **moved}, group)
    rows = before.size(0)
    origin = fn(torch.arange(rows // group, device=sentence.device).repeat_interleave(group), 0)
    firsts, counts = torch.unique_consecutive(origin, return_counts=True)
    group = int(counts[0]) if len(counts) and bool((counts == counts[0]).all()) else 1
    picked = firsts if group > 1 else origin
    return Mapped({**{key: value.index_select(0, picked) for key, value in state.items()
                      if key in source}, **moved}, group)
