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
    ahead_until: float = 0.0  # until when it steps alone (its head start)
    sent: set = dataclasses.field(default_factory=set)  # its sentences answered (places)


class Turns:
    """Which of a lane's batches take the next step: a small batch that joined busy batches
    (at most half the sentences of each) steps alone for ``head_start`` seconds, its steps
    alternating with steps of every batch so that those it takes alone use at most half the
    lane's time; otherwise every batch steps."""

    def __init__(self, head_start: float):
        self.head_start = head_start
        self.alone = self.together = 0.0  # seconds of steps while some batch is ahead

    def admit(self, batch: _Batch, running: List[_Batch], now: float) -> None:
        others = [b for b in running if b.ahead_until <= now]
        if others and 2 * len(batch.order) <= min(len(b.order) for b in others):
            batch.ahead_until = now + self.head_start

    def choose(self, running: List[_Batch], now: float):
        """None: every batch steps; else the test of the batches that step alone."""
        if not any(b.ahead_until > now for b in running):
            self.alone = self.together = 0.0
            return None
        if self.alone <= self.together:
            return lambda b: b.ahead_until > now
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
    variants, searches, turns, stopping = {}, Searches(), Turns(head_start), False
    while True:
        while not stopping and conn.poll(None if not searches else 0):
            message = conn.recv()
            if message[0] == "stop":
                stopping = True
                break
            _, batch_id, tokens, n_best, attention = message
            key = (n_best, attention)
            if key not in variants:
                variants[key] = _variant(translator, n_best, attention)
            batch, steps = _start(variants[key], batch_id, tokens, attention)
            turns.admit(batch, searches.tags(), time.monotonic())
            with inference():
                _send(conn, searches.add(batch, steps))
        if not searches:
            if stopping:
                return
            continue
        start = time.monotonic()
        only = turns.choose(searches.tags(), start)
        with inference():
            _send(conn, searches.step(only=only))
        turns.took(only, time.monotonic() - start)


def _send(conn, events) -> None:
    """Each sentence's translation as it ends, then each batch's end (with the translations of
    sentences not sent yet: none ended in the search), or its error, to the server."""
    for batch, kind, value in events:
        if kind == "ended":
            place, translation = value
            batch.sent.add(place)
            conn.send(("sentence", batch.id, batch.order[place], _result(batch, translation)))
        elif kind == "done":
            results = [None] * len(value)
            for place, translation in enumerate(value):
                if place not in batch.sent:
                    results[batch.order[place]] = _result(batch, translation)
            conn.send(("done", batch.id, results))
        else:  # a batch that fails fails its sentences not yet answered
            conn.send(("error", batch.id, f"{type(value).__name__}: {value}"))


def _start(translator, batch_id: int, tokens: List[List[str]], attention: bool):
    """The batch and its search (a step generator in shared mode), sentences sorted by length
    as translate.py sorts them."""
    order = sorted(range(len(tokens)), key=lambda i: len(tokens[i]))
    ordered = [tokens[i] for i in order]
    twin = copy.copy(translator)  # a decoder state of its own: other batches step in between
    model = translator.model
    twin.model = model.replica() if isinstance(model, EnsembleModel) else replica(model)
    steps = twin.batch_steps(list(range(len(ordered))), ordered, None, shared=True)
    return _Batch(batch_id, order, attention), steps


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
