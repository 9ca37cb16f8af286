"""What a lane keeps of its searches, and which of them take the next step.

A lane's batches (_Batch) start in chunks (_Chunk) that join its searches (_Search). Joined steps
cost more than a short sentence's own (2.4-3.2x for one sentence beside ten long ones, the
Transformer fixture), so short sentences beside long ones take some steps alone (Turns).
"""
import dataclasses
from typing import Dict, List

# Sentences stepping alone (Turns) that may take two thirds of a lane's time instead of half:
# a few short requests' own (mixed load: short p99 91-113 ms against 115-137); two thirds for
# batches of many short sentences too cost 32 clients of ten sentences 12% of their throughput
FEW_AHEAD = 4


@dataclasses.dataclass(eq=False)
class _Batch:
    id: int
    order: List[int]  # the batch's sentences in decoding order (by length)
    attention: bool
    lengths: List[int]  # the source length of each, in that order
    sent: set = dataclasses.field(default_factory=set)  # its sentences answered (places)
    over: bool = False  # its end (or error) sent


@dataclasses.dataclass(eq=False)
class _Chunk:
    """Sentences of a batch that start together: ``places`` in the batch, their ``tokens``."""
    key: tuple  # the batch's settings (n_best, attention)
    batch: _Batch
    places: List[int]
    tokens: List[List[str]]


@dataclasses.dataclass(eq=False)
class _Search:
    """One of the lane's searches and the sentences it decodes: several chunks where they
    joined it between its steps; ``places``: its sentences in its own order, as (batch,
    place); ``decoding``: the source length of each one still decoding, by its index there
    (a search that sentences keep joining runs on, so its places only grow)."""
    key: tuple  # the settings (n_best, attention) of its batches
    places: List[tuple] = dataclasses.field(default_factory=list)
    decoding: Dict[int, int] = dataclasses.field(default_factory=dict)
    offered: List[_Chunk] = dataclasses.field(default_factory=list)  # not taken yet
    ahead_until: float = 0.0  # until when it steps alone (its head start)

    def add(self, chunk: _Chunk) -> None:
        for place in chunk.places:
            self.decoding[len(self.places)] = chunk.batch.lengths[place]
            self.places.append((chunk.batch, place))

    def ended(self, index: int) -> tuple:
        """(batch, place) of its sentence ``index``, which no longer decodes."""
        del self.decoding[index]
        return self.places[index]

    def batches(self) -> List[_Batch]:
        return list({id(batch): batch for batch, _ in self.places}.values())


def short_beside(shorter: List[int], longer: List[int]) -> bool:
    """Whether sources ``shorter`` tokens long are short beside sources ``longer`` long: each
    at most half as long as every one of them (the short step alone, Turns; the batcher sends
    them to a busy lane at once)."""
    return bool(shorter) and bool(longer) and 2 * max(shorter) <= min(longer)


class Turns:
    """Which of a lane's searches take the next step. Short sentences beside long ones step
    alone, as searches of their own, for ``head_start`` seconds, their steps alternating with
    steps of every search so that those they take alone use at most half the lane's time (two
    thirds while they decode FEW_AHEAD sentences or fewer: a short request's own); otherwise
    every search steps. Short beside long: a batch whose longest source is at most half as
    long as every running sentence's (and every sentence waiting to start), and the running
    searches whose every sentence is at most half as long as every sentence of a batch that
    arrives (which starts a search of its own instead of joining theirs)."""

    def __init__(self, head_start: float):
        self.head_start = head_start
        self.alone = self.together = 0.0  # seconds of steps while some search is ahead

    def ahead_until(self, lengths: List[int], running: List[_Search], now: float,
                    waiting: List[int] = ()) -> float:
        """Until when a batch of sources ``lengths`` tokens long, arriving now, steps alone (0:
        it does not). ``waiting``: the shortest source of each chunk waiting to start, which
        counts as running (else a short batch would wait behind long ones and join them)."""
        others = [min(s.decoding.values(), default=0) for s in running
                  if s.ahead_until <= now] + list(waiting)
        if short_beside(lengths, others):
            return now + self.head_start
        return 0.0

    def let_ahead(self, lengths: List[int], running: List[_Search], now: float) -> list:
        """The running searches that step alone from now on, beside sentences of sources
        ``lengths`` tokens long that start now (and do not join them)."""
        ahead = [s for s in running if s.ahead_until <= now
                 and short_beside(list(s.decoding.values()), lengths)]
        for search in ahead:
            search.ahead_until = now + self.head_start
        return ahead

    def choose(self, running: List[_Search], now: float):
        """None: every search steps; else the test of the searches that step alone."""
        ahead = [s for s in running if s.ahead_until > now]
        if not ahead:
            self.alone = self.together = 0.0
            return None
        few = sum(len(s.decoding) for s in ahead) <= FEW_AHEAD
        if self.alone <= (2 if few else 1) * self.together:
            return lambda s: s.ahead_until > now
        return None

    def took(self, only, seconds: float) -> None:
        if only is not None:
            self.alone += seconds
        else:
            self.together += seconds
