"""Lanes: the processes that decode the server's batches, outside its interpreter lock.

Each lane is a process of one torch thread with its own copy of the model (started by spawn, not
fork: the server has threads by then). It receives batches through a pipe and decodes several
at once: each batch is a search of its own (search/loop.py, a step generator), and at each step
the lane runs the decoder steps of all its batches together (models/shared_step.py), so a batch
that arrives while others decode joins them at the next step, its rows beside theirs, and each
batch leaves when its last sentence ends.

Joined steps cost more than a small batch's own (2.4-3.2x for one sentence beside ten long ones,
the Transformer fixture), so a short request beside long ones takes some steps alone (Turns).

The server's own process keeps to HTTP and the queue, and its event loop never waits on a
decoding thread.
"""
import copy
import dataclasses
import multiprocessing
import signal
import time
from typing import List

import torch

from onmt_lite.models.ensemble import EnsembleModel
from onmt_lite.models.model import inference, replica
from onmt_lite.models.shared_step import Searches


class LaneError(RuntimeError):
    """A lane that failed to start, or died."""


class Lane:
    """The server's handle on one lane process: ``send`` batches, ``receive`` their results."""

    def __init__(self, options: dict, head_start: float):
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=lane_main, args=(options, child, head_start),
                                       daemon=True, name="onmt_lite-lane")
        self.process.start()
        child.close()
        self.active = {}  # batch id -> its jobs (the batches this lane decodes)
        try:
            message = self.conn.recv()
        except EOFError:
            message = ("failed", f"the lane process exited ({self.process.exitcode})")
        if message[0] != "ready":
            self.process.join(5)
            raise LaneError(message[1])

    def send(self, batch_id: int, tokens: List[List[str]], n_best: int, attention: bool):
        self.conn.send(("batch", batch_id, tokens, n_best, attention))

    def receive(self):
        """("sentence", batch id, index, result) as each sentence ends; then ("done", batch id,
        results: None for those sent already) or ("error", batch id, message). LaneError once
        the process has ended."""
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            raise LaneError(f"the lane process ended (exit status {self.process.exitcode})") \
                from None

    def stop(self) -> None:
        """Asks the lane to finish its batches and end; waits for it."""
        try:
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
    sent: set = dataclasses.field(default_factory=set)  # its sentences answered (places)
    over: bool = False  # its end (or error) sent


@dataclasses.dataclass(eq=False)
class _Search:
    """One of the lane's searches and the batches it decodes: several where batches joined it
    between its steps; ``places``: its sentences in its own order, as (batch, place)."""
    key: tuple  # the settings (n_best, attention) of its batches
    batches: List[_Batch] = dataclasses.field(default_factory=list)
    places: List[tuple] = dataclasses.field(default_factory=list)
    lengths: List[int] = dataclasses.field(default_factory=list)  # of each place's source
    ahead_until: float = 0.0  # until when it steps alone (its head start)

    def add(self, batch: _Batch, ordered: List[List[str]]) -> None:
        self.batches.append(batch)
        self.places += [(batch, place) for place in range(len(batch.order))]
        self.lengths += [len(tokens) for tokens in ordered]

    def shortest(self) -> int:
        """The source length of its shortest sentence still decoding."""
        return min((length for (batch, place), length in zip(self.places, self.lengths)
                    if place not in batch.sent and not batch.over), default=0)


class Turns:
    """Which of a lane's searches take the next step: a batch of short sentences that arrives
    beside long ones (its longest source at most half as long as every running sentence's)
    steps alone, as a search of its own, for ``head_start`` seconds, its steps alternating with
    steps of every search so that those it takes alone use at most half the lane's time;
    otherwise every search steps."""

    def __init__(self, head_start: float):
        self.head_start = head_start
        self.alone = self.together = 0.0  # seconds of steps while some search is ahead

    def ahead_until(self, longest: int, running: List[_Search], now: float) -> float:
        """Until when a batch whose longest source has ``longest`` tokens, arriving now, steps
        alone (0: it does not)."""
        others = [s for s in running if s.ahead_until <= now]
        if others and 2 * longest <= min(s.shortest() for s in others):
            return now + self.head_start
        return 0.0

    def choose(self, running: List[_Search], now: float):
        """None: every search steps; else the test of the searches that step alone."""
        if not any(s.ahead_until > now for s in running):
            self.alone = self.together = 0.0
            return None
        if self.alone <= self.together:
            return lambda s: s.ahead_until > now
        return None

    def took(self, only, seconds: float) -> None:
        if only is not None:
            self.alone += seconds
        else:
            self.together += seconds


def lane_main(options: dict, conn, head_start: float) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server stops its lanes itself
    torch.set_num_threads(1)
    from onmt_lite.translate.translator import build_translator  # in the child: after threads
    try:
        translator = build_translator(options)
    except Exception as err:  # noqa: BLE001 - reported to the server, which says why
        conn.send(("failed", f"{type(err).__name__}: {err}"))
        return
    conn.send(("ready",))
    lane = _LaneSearches(translator, Turns(head_start))
    stopping = False
    while True:
        while not stopping and conn.poll(None if not lane.searches else 0):
            message = conn.recv()
            if message[0] == "stop":
                stopping = True
                break
            _, batch_id, tokens, n_best, attention = message
            order = sorted(range(len(tokens)), key=lambda i: len(tokens[i]))  # as translate.py
            with inference():
                lane.admit(conn, _Batch(batch_id, order, attention), [tokens[i] for i in order],
                           n_best)
        if not lane.searches:
            if stopping:
                return
            continue
        with inference():
            lane.step(conn)


class _LaneSearches:
    """A lane's searches: a batch that arrives joins the running search of its settings at
    its next step (its rows beside the others', each sentence at its own step), unless it
    takes a head start (Turns) or that search cannot take sentences (then the batch is a
    search of its own, stepping beside the others)."""

    def __init__(self, translator, turns: Turns):
        self.translator, self.turns = translator, turns
        self.variants = {}  # (n_best, attention) -> the translator with those settings
        self.searches = Searches()
        self.open = {}  # (n_best, attention) -> the search that batches of those settings join

    def admit(self, conn, batch: _Batch, ordered: List[List[str]], n_best: int) -> None:
        """Starts decoding ``batch``, its sentences' tokens ``ordered`` as its ``order``."""
        key = (n_best, batch.attention)
        ahead = self.turns.ahead_until(len(ordered[-1]), self.searches.tags(), time.monotonic())
        search = self.open.get(key)
        if not ahead and search is not None and not any(
                self.translator.empty_source(t) for t in ordered) \
                and self.searches.offer(search, ordered):
            search.add(batch, ordered)
            return
        if key not in self.variants:
            self.variants[key] = _variant(self.translator, n_best, batch.attention)
        search = _Search(key, ahead_until=ahead)
        search.add(batch, ordered)
        twin = copy.copy(self.variants[key])  # a decoder state of its own
        model = twin.model
        twin.model = model.replica() if isinstance(model, EnsembleModel) else replica(model)
        steps = twin.batch_steps(list(range(len(ordered))), ordered, None, shared=True,
                                 join=not ahead)
        events = self.searches.add(search, steps)
        if search in self.searches.joining:
            self.open[key] = search
        self._send(conn, events)

    def step(self, conn) -> None:
        start = time.monotonic()
        only = self.turns.choose(self.searches.tags(), start)
        events = self.searches.step(only=only)
        self.turns.took(only, time.monotonic() - start)
        self._send(conn, events)

    def _send(self, conn, events) -> None:
        """Each sentence's translation as it ends, each batch's end once all its sentences are
        sent (with the translations of those not sent yet: none ended in the search), or its
        error, to the server."""
        for search, kind, value in events:
            if kind == "ended":
                index, translation = value
                batch, place = search.places[index]
                batch.sent.add(place)
                conn.send(("sentence", batch.id, batch.order[place], _result(batch, translation)))
                if len(batch.sent) == len(batch.order):
                    batch.over = True
                    conn.send(("done", batch.id, [None] * len(batch.order)))
                continue
            if self.open.get(search.key) is search:
                del self.open[search.key]
            if kind == "done":
                late = {}
                for (batch, place), translation in zip(search.places, value):
                    if place not in batch.sent:
                        late.setdefault(id(batch), {})[place] = _result(batch, translation)
                for batch in search.batches:
                    if not batch.over:
                        results = [None] * len(batch.order)
                        for place, result in late.get(id(batch), {}).items():
                            results[batch.order[place]] = result
                        conn.send(("done", batch.id, results))
            elif kind == "error":  # a search that fails fails its sentences not yet answered
                for batch in search.batches:
                    if not batch.over:
                        conn.send(("error", batch.id, f"{type(value).__name__}: {value}"))
            else:  # "unjoined": offered as the search ended (before its end): anew
                waiting = search.batches[-len(value):]
                search.batches = search.batches[:-len(value)]
                for batch, ordered in zip(waiting, value):
                    self.admit(conn, batch, ordered, search.key[0])
                continue
            for batch in search.batches:
                batch.over = True


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
