"""The Transformer decoder's self-attention keys and values, kept across steps and beam reorders.

Every layer's keys and values share one buffer (layers, 2, buffer rows, heads, capacity, dim)
that grows geometrically, so a step writes its position in place instead of re-copying the
prefix. ``slot[r]`` is the buffer row that holds logical row r's history. A beam step keeps
every row in its sentence: then only hypotheses continued more than once are copied (into buffer
rows that nobody continued), and the decoder runs its step in buffer order (``to_buffer`` /
``from_buffer``), valid because a sentence's rows share one source. Any other reorder (tiling,
finished sentences leaving) copies the live prefix into a compact buffer in logical order.
"""
from typing import Tuple

import torch

INITIAL_CAPACITY = 16


class KVCache:
    def __init__(self, layers: int, rows: int, heads: int, dim: int, dtype, device):
        self.buffer = torch.empty(layers, 2, rows, heads, INITIAL_CAPACITY, dim, dtype=dtype,
                                  device=device)
        self.length = 0
        self.slot = torch.arange(rows, device=device)  # buffer row of each logical row
        self.inverse = self.slot  # logical row held by each buffer row
        self.in_order = True  # slot is the identity

    def live(self) -> torch.Tensor:
        return self.buffer[..., :self.length, :]

    def reserve(self, steps: int) -> None:
        """Makes room for ``steps`` more positions."""
        needed, capacity = self.length + steps, self.buffer.size(4)
        if needed > capacity:
            shape = list(self.buffer.shape)
            shape[4] = max(needed, 2 * capacity)
            grown = self.buffer.new_empty(shape)
            grown[..., :self.length, :] = self.live()
            self.buffer = grown

    def append(self, layer: int, keys: torch.Tensor,
               values: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Writes (buffer rows, heads, T, dim) keys/values after the prefix; returns the whole
        of this layer's keys and values, prefix included, as views. ``advance`` moves on."""
        end = self.length + keys.size(2)
        self.buffer[layer, 0, :, :, self.length:end] = keys
        self.buffer[layer, 1, :, :, self.length:end] = values
        return self.buffer[layer, 0, :, :, :end], self.buffer[layer, 1, :, :, :end]

    def advance(self, steps: int) -> None:
        self.length += steps

    def to_buffer(self, x: torch.Tensor) -> torch.Tensor:
        """Rows of ``x`` from logical to buffer order."""
        return x if self.in_order else x.index_select(0, self.inverse)

    def from_buffer(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.in_order else x.index_select(0, self.slot)

    def reorder(self, origin: torch.Tensor, sentence: torch.Tensor,
                within_sentences: bool) -> None:
        """New logical row r continues the history in buffer row ``origin[r]``.

        Args:
            sentence: the sentence of each logical row (also of each buffer row: rows change
                sentence only through the compacting path, which puts buffer rows in logical
                order).
            within_sentences: every row stays in its sentence (``sentence`` is unchanged, so
                the number of rows too).
        """
        rows = origin.numel()
        if not within_sentences:
            compact = self.buffer.new_empty(self.buffer.shape[:2] + (rows,)
                                            + self.buffer.shape[3:])
            torch.index_select(self.live(), 2, origin, out=compact[..., :self.length, :])
            self.buffer = compact
            self.slot = self.inverse = torch.arange(rows, device=origin.device)
            self.in_order = True
            return
        order = torch.arange(rows, device=origin.device)
        first = torch.full_like(origin, rows).scatter_reduce_(0, origin, order, "amin")
        branches = first.index_select(0, origin) != order  # a later child of a buffer row
        if bool(branches.any()):
            children = branches.nonzero().squeeze(1)
            unused = (first == rows).nonzero().squeeze(1)  # buffer rows nobody continues
            # as many unused rows as branching children in each sentence: pair them by sentence
            children = children.index_select(0, sentence.index_select(0, children).argsort(
                stable=True))
            unused = unused.index_select(0, sentence.index_select(0, unused).argsort(stable=True))
            live = self.live()
            live.index_copy_(2, unused, live.index_select(2, origin.index_select(0, children)))
            origin = origin.index_put((children,), unused)
        self.slot = origin
        self.inverse = torch.empty_like(origin).scatter_(0, origin, order)
        self.in_order = False

    def logical(self, layer: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Copies of this layer's cached keys and values in logical row order."""
        live = self.live()[layer].index_select(1, self.slot)
        return live[0], live[1]
