"""What runs in a lane (lanes.py): its models' searches.

A lane is shared by every model of the server: it loads a model as soon as the model loads, or
at its first batch of it where that load failed (ModelSource: the translator written once to a
file when the model loaded, mapped read-only, so that every lane maps the same pages; or, where
the translator cannot be written, one built from the model's options), and frees it when the
server unloads the model. It receives batches through a pipe and decodes each model's as one
search (search/loop.py, a step generator that sentences join between steps): a batch that
arrives while others of its model decode joins them at the next step, its rows beside theirs,
each sentence at its own step, and each sentence leaves as it ends. Where a search cannot take
sentences (its rule or processors read the batch or the step), each batch is a search of its
own and the lane runs their decoder steps together (models/shared_step.py). The searches of
different models take steps in turn, one model's step at a time.

Joined steps cost more than a short sentence's own (2.4-3.2x for one sentence beside ten long
ones, the Transformer fixture), so short sentences beside long ones take some steps alone
(Turns).
"""
import collections
import copy
import dataclasses
import signal
import time
from typing import Dict, List

import torch

from onmt_lite.models.ensemble import EnsembleModel
from onmt_lite.models.model import inference, replica
from onmt_lite.models.shared_step import Searches
from onmt_lite.parent_watch import end_with_parent
from onmt_lite.serve.turns import (  # noqa: F401 - FEW_AHEAD: the tests read it here
    FEW_AHEAD,
    Turns,
    _Batch,
    _Chunk,
    _Search,
)
from onmt_lite.serve.weights import free_memory

# Source tokens that start decoding in a lane at one step: encoding them pauses its other
# sentences (128 tokens, four long sentences: ~10 ms on one thread, the Transformer fixture).
JOIN_TOKENS = 128


def lane_main(conn, server: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server stops its lanes itself
    end_with_parent(server)  # even when it is killed
    serve(conn)


def serve(conn) -> None:
    """Decodes what the server sends on ``conn`` until it says stop (a process that built the
    first model goes on here as a lane, building.py)."""
    torch.set_num_threads(1)
    conn.send(("ready",))
    models = _Models(conn)
    stopping = False
    while True:
        while not stopping and conn.poll(None if not models.busy() else 0):
            message = conn.recv()
            if message[0] == "stop":
                stopping = True
                break
            models.receive(message)
        with inference():
            if models.busy():
                models.step()
            elif stopping:
                return


class _Tagged:
    """A lane's pipe as one model's searches write to it: each message names the model."""

    def __init__(self, conn, key):
        self.conn, self.key = conn, key

    def send(self, message: tuple) -> None:
        self.conn.send((message[0], self.key) + tuple(message[1:]))


class _Models:
    """A lane's models by key, each with its own searches (_LaneSearches), loaded when the
    server says so or at their first batch; the busy ones take steps in turn."""

    def __init__(self, conn):
        self.conn = conn
        self.sources: Dict[object, object] = {}  # key -> its lanes.ModelSource
        self.lanes: Dict[object, "_LaneSearches"] = {}
        self.turn = collections.deque()  # the keys of the models, the next to step first

    def busy(self) -> bool:
        return any(lane.busy() for lane in self.lanes.values())

    def receive(self, message: tuple) -> None:
        kind, key = message[0], message[1]
        if kind == "model":
            self.sources[key] = message[2]
        elif kind == "unload":
            self.sources.pop(key, None)
            if self.lanes.pop(key, None) is not None:
                self.turn.remove(key)
                free_memory()  # its mapped weights go with their last tensor
        elif kind == "drop":
            if key in self.lanes:
                self.lanes[key].drop(_Tagged(self.conn, key), *message[2:])
        elif kind == "load":
            try:
                self._loaded(key)
            except Exception:  # noqa: BLE001 - its first batch loads it again, or says why
                pass
        else:
            self._batch(key, *message[2:])

    def _loaded(self, key) -> "_LaneSearches":
        """The model's searches, the model loaded first if it is not yet."""
        if key not in self.lanes:
            source = self.sources[key]
            self.lanes[key] = _LaneSearches(_load(source), Turns(source.head_start))
            self.turn.append(key)
        return self.lanes[key]

    def _batch(self, key, batch_id: int, tokens: List[List[str]], n_best: int,
               attention: bool) -> None:
        conn = _Tagged(self.conn, key)
        try:
            searches = self._loaded(key)
        except Exception as err:  # noqa: BLE001 - the batch fails saying why
            conn.send(("error", batch_id, f"the model did not load in a lane: "
                                          f"{type(err).__name__}: {err}"))
            return
        order = sorted(range(len(tokens)), key=lambda i: len(tokens[i]))  # as translate.py
        ordered = [tokens[i] for i in order]
        with inference():
            searches.admit(conn, _Batch(batch_id, order, attention,
                                        [len(t) for t in ordered]), ordered, n_best)

    def step(self) -> None:
        """One turn of the next busy model."""
        for _ in range(len(self.turn)):
            key = self.turn[0]
            self.turn.rotate(-1)
            if self.lanes[key].busy():
                self.lanes[key].step(_Tagged(self.conn, key))
                return


def _load(source):
    """A model's translator in a lane (``source``: a lanes.ModelSource): its file mapped
    read-only (every lane maps the same pages), or built from its options. The file is no
    checkpoint: the process that loaded the model as data wrote it, in a folder only its user
    can write, and a lane trusts it as it trusts every message the server pickles onto its
    pipe."""
    if source.weights is not None:
        translator = torch.load(source.weights, mmap=True, weights_only=False)
        from onmt_lite.models.inference import attach_programs, has_programs
        if has_programs(translator.model):  # its programs load from the compile cache
            attach_programs(translator.model, source.options.get("compile_cache") or "")
        return translator
    from onmt_lite.translate.build import build_translator  # in the child: after threads
    return build_translator(source.options)


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
