"""Lanes: the processes that decode the server's batches, outside its interpreter lock.

Each lane is a process of one torch thread with its own copy of the model (started by spawn, not
fork: the server has threads by then). It receives batches through a pipe and decodes them as
one search (search/loop.py, a step generator that sentences join between steps): a batch that
arrives while others decode joins them at the next step, its rows beside theirs, each sentence
at its own step, and each sentence leaves as it ends. Where a search cannot take sentences
(its rule or processors read the batch or the step), each batch is a search of its own and the
lane runs their decoder steps together (models/shared_step.py).

Joined steps cost more than a short sentence's own (2.4-3.2x for one sentence beside ten long
ones, the Transformer fixture), so short sentences beside long ones take some steps alone
(Turns).

The server's own process keeps to HTTP and the queue, and its event loop never waits on a
decoding thread.
"""
import collections
import copy
import dataclasses
import multiprocessing
import os
import signal
import threading
import time
from typing import Dict, List

import torch

from onmt_lite.models.ensemble import EnsembleModel
from onmt_lite.models.model import inference, replica
from onmt_lite.models.shared_step import Searches
from onmt_lite.parent_watch import end_with_parent

# Source tokens that start decoding in a lane at one step: encoding them pauses its other
# sentences (128 tokens, four long sentences: ~10 ms on one thread, the Transformer fixture).
JOIN_TOKENS = 128
# Sentences stepping alone (Turns) that may take two thirds of a lane's time instead of half:
# a few short requests' own (mixed load: short p99 91-113 ms against 115-137); two thirds for
# batches of many short sentences too cost 32 clients of ten sentences 12% of their throughput
FEW_AHEAD = 4


class LaneError(RuntimeError):
    """A lane that failed to start, or died."""


class Lane:
    """The server's handle on one lane process: ``send`` batches, ``receive`` their results."""

    def __init__(self, options: dict, head_start: float):
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=lane_main, args=(options, child, head_start, os.getpid()),
                                       daemon=True, name="onmt_lite-lane")
        self.process.start()
        child.close()
        self.active = {}  # batch id -> its jobs (the batches this lane decodes)
        self.sending = threading.Lock()  # batches and drops come from different threads
        try:
            message = self.conn.recv()
        except EOFError:
            message = ("failed", f"the lane process exited ({self.process.exitcode})")
        if message[0] != "ready":
            self.process.join(5)
            raise LaneError(message[1])

    def send(self, batch_id: int, tokens: List[List[str]], n_best: int, attention: bool):
        with self.sending:
            self.conn.send(("batch", batch_id, tokens, n_best, attention))

    def drop(self, batch_id: int, indices: List[int]) -> None:
        """Asks the lane to drop sentences of a batch (their client has gone): it sends no
        result for them, and stops a search once every sentence it decodes is dropped."""
        try:
            with self.sending:
                self.conn.send(("drop", batch_id, indices))
        except (BrokenPipeError, OSError):
            pass  # it has ended: the collector says so

    def ended(self) -> str:
        """How the lane process ended (it is reaped here): its exit status or signal."""
        self.process.join(5)
        code = self.process.exitcode
        if code is None:
            return "still running"
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit status {code}"

    def receive(self):
        """("sentence", batch id, index, result) as each sentence ends; then ("done", batch id,
        results: None for those sent already) or ("error", batch id, message). LaneError once
        the process has ended."""
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            raise LaneError("the lane process ended") from None

    def stop(self) -> None:
        """Asks the lane to finish its batches and end; waits for it."""
        try:
            with self.sending:
                self.conn.send(("stop",))
        except (BrokenPipeError, OSError):
            pass
        self.process.join(60)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


# -- the lane process -------------------------------------------------------------------------
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


def lane_main(options: dict, conn, head_start: float, server: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server stops its lanes itself
    end_with_parent(server)  # even when it is killed
    torch.set_num_threads(1)
    from onmt_lite.translate.build import build_translator  # in the child: after threads
    try:
        translator = build_translator(options)
    except Exception as err:  # noqa: BLE001 - reported to the server, which says why
        conn.send(("failed", f"{type(err).__name__}: {err}"))
        return
    conn.send(("ready",))
    lane = _LaneSearches(translator, Turns(head_start))
    stopping = False
    while True:
        while not stopping and conn.poll(None if not lane.busy() else 0):
            message = conn.recv()
            if message[0] == "stop":
                stopping = True
                break
            if message[0] == "drop":
                lane.drop(conn, *message[1:])
                continue
            _, batch_id, tokens, n_best, attention = message
            order = sorted(range(len(tokens)), key=lambda i: len(tokens[i]))  # as translate.py
            ordered = [tokens[i] for i in order]
            with inference():
                lane.admit(conn, _Batch(batch_id, order, attention, [len(t) for t in ordered]),
                           ordered, n_best)
        with inference():
            if lane.busy():
                lane.step(conn)
            elif stopping:
                return


class _LaneSearches:
    """A lane's searches. A batch that arrives joins the running search of its settings (its
    rows beside the others', each sentence at its own step) in chunks of at most JOIN_TOKENS
    source tokens a step, since encoding them pauses the others; a batch of short sentences
    beside long ones takes a head start (Turns), and a search that cannot take sentences
    runs each batch as a search of its own, stepping beside the others."""

    def __init__(self, translator, turns: Turns):
        self.translator, self.turns = translator, turns
        self.variants = {}  # (n_best, attention) -> the translator with those settings
        self.joinable = {}  # (n_best, attention) -> whether its searches take sentences
        self.searches = Searches()
        self.open = {}  # (n_best, attention) -> the search that batches of those settings join
        self.waiting = collections.deque()  # chunks to start, a step's worth at a time
        self.batches: Dict[int, _Batch] = {}  # by id, until their end is sent

    def busy(self) -> bool:
        return bool(self.searches) or bool(self.waiting)

    def admit(self, conn, batch: _Batch, ordered: List[List[str]], n_best: int) -> None:
        """Starts ``batch`` (its sentences' tokens ``ordered`` as its ``order``), or queues
        its chunks to join a search."""
        key = (n_best, batch.attention)
        self.batches[batch.id] = batch
        if key not in self.variants:
            self.variants[key] = _variant(self.translator, n_best, batch.attention)
            self.joinable[key] = self.variants[key].joinable()
        ahead = self.turns.ahead_until(batch.lengths, self.searches.tags(), time.monotonic(),
                                       [min(map(len, c.tokens)) for c in self.waiting])
        if ahead or not self.joinable[key]:
            self._start(conn, _Chunk(key, batch, list(range(len(ordered))), ordered), ahead)
            return
        chunk, tokens = [], 0
        for place, sentence in enumerate(ordered):
            if chunk and tokens + len(sentence) > JOIN_TOKENS:
                self.waiting.append(_Chunk(key, batch, chunk, [ordered[p] for p in chunk]))
                chunk, tokens = [], 0
            chunk.append(place)
            tokens += len(sentence)
        self.waiting.append(_Chunk(key, batch, chunk, [ordered[p] for p in chunk]))

    def start_waiting(self, conn) -> None:
        """Offers waiting chunks to the searches they join, or starts searches with them, at
        most JOIN_TOKENS source tokens (and one chunk at least) a step."""
        tokens = 0
        while self.waiting and (tokens == 0 or tokens + sum(map(
                len, self.waiting[0].tokens)) <= JOIN_TOKENS):
            chunk = self.waiting.popleft()
            tokens += sum(map(len, chunk.tokens))
            search = self.open.get(chunk.key)
            if search is not None and self.turns.let_ahead(
                    [len(t) for t in chunk.tokens], [search], time.monotonic()):
                del self.open[chunk.key]  # long beside short: a search of its own
                search = None
            if search is not None and self.searches.offer(search, chunk.tokens):
                search.add(chunk)
                search.offered.append(chunk)
            else:
                self._start(conn, chunk, 0.0)

    def _start(self, conn, chunk: _Chunk, ahead: float) -> None:
        """A search of its own for ``chunk``: one that others join unless it is ``ahead``."""
        search = _Search(chunk.key, ahead_until=ahead)
        search.add(chunk)
        twin = copy.copy(self.variants[chunk.key])  # a decoder state of its own
        model = twin.model
        twin.model = model.replica() if isinstance(model, EnsembleModel) else replica(model)
        steps = twin.batch_steps(list(range(len(chunk.tokens))), chunk.tokens, None,
                                 shared=True, join=not ahead)
        events = self.searches.add(search, steps)
        if search in self.searches.joining:
            self.open[chunk.key] = search
        self._send(conn, events)

    def step(self, conn) -> None:
        """One turn (Turns): the searches whose turn it is take a step; on a turn of every
        search, waiting chunks start first (encoding them is the others' time)."""
        start = time.monotonic()
        only = self.turns.choose(self.searches.tags(), start)
        if only is None:
            self.start_waiting(conn)
        events = self.searches.step(only=only) if self.searches else []
        self.turns.took(only, time.monotonic() - start)
        self._send(conn, events)

    def _send(self, conn, events) -> None:
        """Each sentence's translation as it ends, and each batch's end once all its
        sentences are sent, or its error, to the server."""
        for search, kind, value in events:
            if kind == "ended":
                self._sentence(conn, *search.ended(value[0]), value[1])
                continue
            if kind == "joined":
                del search.offered[:len(value)]
                continue
            if self.open.get(search.key) is search:
                del self.open[search.key]
            if kind == "unjoined":  # offered as it ended: to start anew, first
                del search.places[len(search.places) - sum(len(c.places) for c in
                                                           search.offered):]
                self.waiting.extendleft(reversed(search.offered))
            elif kind == "done":  # those not reported as they ended (the sentence engine's)
                for (batch, place), translation in zip(search.places, value):
                    if not batch.over and place not in batch.sent:
                        self._sentence(conn, batch, place, translation)
            else:  # an error fails the sentences of its batches not answered yet
                for batch in search.batches():
                    if not batch.over:
                        batch.over = True
                        del self.batches[batch.id]
                        conn.send(("error", batch.id, f"{type(value).__name__}: {value}"))
                self.waiting = collections.deque(c for c in self.waiting if not c.batch.over)

    def _sentence(self, conn, batch: _Batch, place: int, translation) -> None:
        if batch.over or place in batch.sent:  # its batch failed, or it was dropped
            return
        batch.sent.add(place)
        conn.send(("sentence", batch.id, batch.order[place], _result(batch, translation)))
        self._end_if_answered(conn, batch)

    def _end_if_answered(self, conn, batch: _Batch) -> None:
        if len(batch.sent) == len(batch.order) and not batch.over:
            batch.over = True
            del self.batches[batch.id]
            conn.send(("done", batch.id, [None] * len(batch.order)))

    def drop(self, conn, batch_id: int, indices: List[int]) -> None:
        """Drops sentences ``indices`` of batch ``batch_id`` (their client has gone): no result
        is sent for them; chunks of dropped sentences only do not start, and a search whose
        every sentence (those offered to it too) is dropped stops; one with others runs on,
        the dropped among them (the rows of a running search are its own to remove)."""
        batch = self.batches.get(batch_id)
        if batch is None:
            return
        places = {place for place, index in enumerate(batch.order) if index in set(indices)}
        batch.sent |= places
        self._end_if_answered(conn, batch)

        def answered(b: _Batch, place: int) -> bool:
            return b.over or place in b.sent
        self.waiting = collections.deque(c for c in self.waiting if not all(
            answered(c.batch, p) for p in c.places))
        for search in self.searches.tags():
            if all(answered(*search.places[i]) for i in search.decoding):  # offered: in it
                self.searches.remove(search)
                if self.open.get(search.key) is search:
                    del self.open[search.key]


def _result(batch: _Batch, t) -> tuple:
    """A sentence's (texts, scores, best hypothesis' target tokens, its attention rows, each
    hypothesis' alignment); the last three only with attention."""
    tgt, attention, alignments = [], None, None
    if batch.attention:
        tgt = list(t.preds[0])
        if t.attns[0].size(0) > len(tgt):  # the row of </s>
            tgt.append("</s>")
        attention = [[round(float(x), 4) for x in row] for row in t.attns[0].tolist()]
        alignments = [alignment(attn, len(pred)) for pred, attn in zip(t.preds, t.attns)]
    return t.output_lines(), [float(s) for s in t.scores], tgt, attention, alignments


def alignment(attn: torch.Tensor, length: int) -> tuple:
    """("s-t s-t ...", [weights]): for each of the ``length`` target tokens, the source token it
    attends to most (Pharaoh pairs, source index first, as OpenNMT-py writes them) and that
    attention weight."""
    if length == 0 or attn.numel() == 0:
        return "", []
    weights, sources = attn[:length].max(dim=1)
    pairs = " ".join(f"{s}-{t}" for t, s in enumerate(sources.tolist()))
    return pairs, [round(float(w), 4) for w in weights.tolist()]


def _variant(translator, n_best: int, attention: bool):
    """The translator with a request's own settings (its model shared)."""
    opt = translator.opt
    if n_best == opt.n_best and attention == opt.keep_attention:
        return translator
    twin = copy.copy(translator)
    twin.opt = dataclasses.replace(opt, n_best=n_best,
                                   keep_attention=attention or opt.replace_unk)
    return twin
