"""The Transformer decoder's self-attention keys and values, kept across steps and beam reorders.

Every layer's keys and values share one buffer (layers, 2, buffer rows, heads, capacity, dim)
that grows geometrically, so a step writes its position in place instead of re-copying the
prefix. ``slot[r]`` is the buffer row that holds logical row r's history, and the decoder runs
its step in buffer order (``to_buffer`` / ``from_buffer``). Rows come in blocks of ``group``
(a sentence's hypotheses, which share one source row): logical row r always lives in buffer
block r // group, anywhere inside it. So a reorder copies only the rows that cannot stay where
their history is: a hypothesis continued twice (its second child) and the sentences that move
into the blocks of sentences that left. Only more rows than the buffer holds (beam tiling)
copies everything, into a new buffer, and so does a small history (WHOLE_COPY), in place.

Rows may also stand at positions of their own (``at``: sentences that joined a running search,
search/loop.py): each writes its keys and values at its own position and reads the columns up to
the furthest row's, the columns past its own masked by the decoder. Masked columns are weighted
by an exact zero, so from then on every buffer is made with zeroed memory (a NaN there would
spread).
"""
from typing import Optional, Tuple

import torch

INITIAL_CAPACITY = 16
# a reorder whose live history holds at most this many values copies all of it, in one call,
# rather than working out which rows must move (a dozen small operations): a lone sentence's
# beam (4 rows, 10-30 positions, the Argos package's 3 layers) in 12-26 us against 41-49;
# past about a million bytes the few rows that move cost less
WHOLE_COPY = 1 << 18


def _copy_rows(history: torch.Tensor, sources: torch.Tensor, targets: torch.Tensor) -> None:
    """Copies rows (dim 2) ``sources[i]`` of ``history`` into rows ``targets[i]``.

    On CPU row by row in one call, in order, unless that would read a row already overwritten
    (50 of 160 rows, 5-30 positions: 1.9-2.1x faster than through a gathered temporary, and up
    to 1.9x faster than a call per row, the gain of short prefixes).
    """
    if history.device.type == "cpu":
        order = torch.arange(sources.numel())
        last_read = torch.full((history.size(2),), -1).scatter_reduce_(0, sources, order, "amax")
        if not bool((last_read.index_select(0, targets) > order).any()):
            torch._foreach_copy_([history.select(2, t) for t in targets.tolist()],
                                 [history.select(2, s) for s in sources.tolist()])
            return
    history.index_copy_(2, targets, history.index_select(2, sources))


class KVCache:
    """Args:
        zeroed: a step may read every column of the buffer, those past each row's position
            masked (the compiled step). Every buffer is then made with zeroed memory, not
            whatever bits it held (masked columns are weighted by zero: a NaN there would
            spread).
        tight: every step reads every column: the capacity is kept within INITIAL_CAPACITY
            columns of those in use, grown and shrunk in such steps rather than doubled (a
            step of 60 rows reads 16, 32 or 64 columns in 1.4, 1.8 or 2.3 ms; of 160 rows, in
            2.9, 3.8 or 7.7 ms). Where only steps of a few rows do (-compile -int8), doubling
            zeroes less memory than such reads cost.
    """

    def __init__(self, layers: int, rows: int, heads: int, dim: int, dtype, device,
                 zeroed: bool = False, tight: bool = False):
        self.tight = tight
        self.new = torch.zeros if zeroed or tight else torch.empty
        self.buffer = self.new(layers, 2, rows, heads, INITIAL_CAPACITY, dim, dtype=dtype,
                               device=device)
        self.rows = rows  # buffer rows in use: the first ``rows``
        self.least_rows = 0  # buffer rows kept at least (spare_rows)
        self.length = 0
        self.slot = torch.arange(rows, device=device)  # buffer row of each logical row
        self.inverse = self.slot  # logical row held by each buffer row in use
        self.in_order = True  # slot is the identity
        self.at: Optional[torch.Tensor] = None  # each buffer row's own position, if rows differ

    def live(self) -> torch.Tensor:
        return self.buffer[:, :, :self.rows, :, :self.length]

    def reserve(self, steps: int) -> None:
        """Makes room for ``steps`` more positions (tight: and no more than INITIAL_CAPACITY
        columns beside, where the furthest row went back: sentences left)."""
        needed, capacity = self.length + steps, self.buffer.size(4)
        if self.tight:
            if needed > capacity or capacity - needed > INITIAL_CAPACITY:
                self._resize(-(-needed // INITIAL_CAPACITY) * INITIAL_CAPACITY)
        elif needed > capacity:
            self._resize(max(needed, 2 * capacity))

    def _resize(self, capacity: int) -> None:
        """A buffer of ``capacity`` columns and of the rows in use only: rows of sentences that
        ended are left behind (else a batch's last sentence, running on to the length limit,
        would grow every row of its batch with it: zeroed memory, all of it resident)."""
        shape = list(self.buffer.shape)
        shape[2], shape[4] = max(self.rows, self.least_rows), capacity
        resized = self.new(shape, dtype=self.buffer.dtype, device=self.buffer.device)
        resized[:, :, :self.rows, :, :self.length] = self.live()
        self.buffer = resized

    def append(self, layer: int, keys: torch.Tensor,
               values: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Writes (rows, heads, T, dim) keys/values after the prefix, in buffer order; returns the
        whole of this layer's keys and values, prefix included, as views. ``advance`` moves on."""
        layer_buffer = self.buffer[layer, :, :self.rows]
        if self.at is not None:  # one position a row, each its own
            rows = torch.arange(self.rows, device=keys.device)
            layer_buffer[0][rows, :, self.at] = keys.squeeze(2)
            layer_buffer[1][rows, :, self.at] = values.squeeze(2)
            return layer_buffer[0, :, :, :self.length + 1], layer_buffer[1, :, :, :self.length + 1]
        end = self.length + keys.size(2)
        layer_buffer[0, :, :, self.length:end] = keys
        layer_buffer[1, :, :, self.length:end] = values
        return layer_buffer[0, :, :, :end], layer_buffer[1, :, :, :end]

    def advance(self, steps: int) -> None:
        self.length += steps

    def own_positions(self) -> None:
        """From now on rows may stand at positions of their own (``at``, set before each step
        by the decoder; ``length`` then counts the columns up to the furthest row's)."""
        if self.new is not torch.zeros:
            self.new = torch.zeros
            self.buffer[..., self.length:, :].zero_()

    def add_rows(self, count: int) -> None:
        """``count`` new logical rows after the others, with empty histories."""
        rows = self.rows + count
        if rows > self.buffer.size(2):
            shape = list(self.buffer.shape)
            shape[2] = max(rows, 2 * self.buffer.size(2))
            larger = self.new(shape, dtype=self.buffer.dtype, device=self.buffer.device)
            larger[:, :, :self.rows] = self.buffer[:, :, :self.rows]
            self.buffer = larger
        else:
            self.buffer[:, :, self.rows:rows].zero_()
        added = torch.arange(self.rows, rows, device=self.slot.device)
        self.slot, self.inverse = torch.cat([self.slot, added]), torch.cat([self.inverse, added])
        self.rows = rows

    def spare_rows(self, rows: int) -> None:
        """Makes the buffer at least ``rows`` rows (spare ones zeroed), its contents kept: a
        compiled step takes buffers of at least two sentences' rows."""
        self.least_rows = max(self.least_rows, rows)
        if rows > self.buffer.size(2):
            shape = list(self.buffer.shape)
            shape[2] = rows
            larger = torch.zeros(shape, dtype=self.buffer.dtype, device=self.buffer.device)
            larger[:, :, :self.buffer.size(2)] = self.buffer
            self.buffer = larger

    def to_buffer(self, x: torch.Tensor) -> torch.Tensor:
        """Rows of ``x`` from logical to buffer order."""
        return x if self.in_order else x.index_select(0, self.inverse)

    def from_buffer(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.in_order else x.index_select(0, self.slot)

    def reorder(self, origin: torch.Tensor, group: int) -> None:
        """New logical row r continues the history in buffer row ``origin[r]``; the new rows come
        in blocks of ``group`` that share a source row."""
        rows = origin.numel()
        order = torch.arange(rows, device=origin.device)
        if rows > self.buffer.size(2):  # beam tiling: copy into a larger buffer
            larger = self.new(self.buffer.shape[:2] + (rows,) + self.buffer.shape[3:],
                              dtype=self.buffer.dtype, device=self.buffer.device)
            torch.index_select(self.live(), 2, origin, out=larger[..., :self.length, :])
            self.buffer, self.rows = larger, rows
            self.slot = self.inverse = order
            self.in_order = True
            return
        if self.buffer[:, :, :rows, :, :self.length].numel() <= WHOLE_COPY:
            self.buffer[:, :, :rows, :, :self.length] = torch.index_select(
                self.buffer[..., :self.length, :], 2, origin)
            self.rows, self.slot = rows, order
            self.inverse, self.in_order = order, True
            return
        # a row stays in its history's buffer row if that row lies in its block and no earlier
        # row continues the same history; the others are copied into their block's free rows
        first = torch.full((self.buffer.size(2),), rows, device=origin.device).scatter_reduce_(
            0, origin, order, "amin")
        stays = (first.index_select(0, origin) == order) & (
            torch.div(origin, group, rounding_mode="floor")
            == torch.div(order, group, rounding_mode="floor"))
        if not bool(stays.all()):
            movers = (~stays).nonzero().squeeze(1)
            taken = torch.zeros(rows, dtype=torch.bool, device=origin.device)
            taken[origin[stays]] = True
            free = (~taken).nonzero().squeeze(1)  # as many per block as movers, both ascending
            _copy_rows(self.buffer[..., :self.length, :], origin.index_select(0, movers), free)
            origin = origin.index_put((movers,), free)
        self.rows, self.slot = rows, origin
        self.inverse = torch.empty_like(origin).scatter_(0, origin, order)
        self.in_order = False

    def logical(self, layer: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Copies of this layer's cached keys and values in logical row order."""
        live = self.live()[layer].index_select(1, self.slot)
        return live[0], live[1]
