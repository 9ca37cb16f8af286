"""Sentences from many requests, decoded in shared batches by the lanes (lanes.py).

Every request's sentences join one queue per model. A lane takes the oldest waiting sentence and
every other waiting sentence that decodes with the same settings and is of a similar length (at
most twice as long or short), up to ``batch_size``, as one batch. When every lane is free a
sentence never waits: one client alone gets its sentence at once. Under load a free lane waits
up to ``batch_wait`` for a fuller batch (while other lanes decode, or while the clients of the
answers just sent may be sending their next requests), and a busy lane takes sentences only
when no lane is free and they have waited ``batch_wait``: they join its search at its next
decoder step rather than waiting for it to end (at most ``max_batches`` batches a lane).

A sentence at most half as long as every sentence a busy lane decodes goes to it at once: it
takes steps alone there (turns.Turns), so it waits for no fuller batch.

A sentence decodes as ``translate.py`` decodes it in a batch of the same sentences; the one rule
of OpenNMT-py's search that depends on the other sentences of a batch is the length limit of
``-max_length_ratio`` (the batch's longest source x ratio + 5).

The lanes are the server's, shared by all its models (pool.py): each model keeps its own queue
and these rules, and sees a lane through its ModelLane (the batches of its own the lane decodes).
A lane busy with other models' searches is free to this one (the models' searches step in turn
there), but a lane idle for all takes a sentence first.

A lane that dies (killed, out of memory, crashed) is replaced after a back-off (pool.py), and the
sentences it held are decoded again: each then alone, on a lane that decodes nothing else (of
any model), so that a sentence that ends a lane of its own doing is found; one that has ended
two lanes fails with an error that says so, and the others go on. A request whose client has
gone is dropped: its sentences that wait leave the queue, those that decode are dropped by their
lane (lane_process.py).
"""
import collections
import dataclasses
import itertools
import logging
import math
import threading
import time
from concurrent.futures import CancelledError, Future
from typing import Callable, Deque, List, Optional

from onmt_lite.serve.lanes import LaneError, ModelSource
from onmt_lite.serve.pool import LanePool, ModelLane
from onmt_lite.serve.turns import short_beside

logger = logging.getLogger("onmt_lite")

# Batches a lane decodes at once by default where they join one search (Scheduling).
JOINED_BATCHES = 4
# Lanes a sentence may end before it fails (the last time decoded alone).
MAX_LANE_DEATHS = 2
# Seconds a lane's feeder waits before it looks again where only other models' batches (on its
# lane or another) hold it back: their ends wake only their own model's feeders.
LOOK_AGAIN = 0.02
# Seconds a stopping model waits for its batches on the lanes to end (then they are dropped).
STOP_WAIT = 60.0


class QueueFull(Exception):
    """More sentences than the queue holds; ``retry_after``: seconds until it likely has room."""

    def __init__(self, retry_after: int):
        super().__init__(f"the queue is full; retry in {retry_after} s")
        self.retry_after = retry_after


class Stopped(Exception):
    """The model stopped (unloaded, the server shutting down, its lanes gone) before the
    sentence ran."""


class SentenceFailed(RuntimeError):
    """A sentence that could not be decoded: its search raised, or it ended MAX_LANE_DEATHS
    lanes. The message says why."""


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a request may choose per sentence; sentences share a batch only with equal ones."""
    n_best: int = 1
    attention: bool = False  # keep each hypothesis' attention (the web page's picture)


@dataclasses.dataclass(eq=False)
class Job:
    tokens: List[str]
    settings: Settings
    future: Future  # its result: (texts, scores, target tokens, attention rows)
    queued: float
    deaths: int = 0  # lanes that ended while decoding it: then it decodes alone
    over: bool = False  # answered, failed or dropped (by whichever thread came first)


@dataclasses.dataclass(frozen=True)
class Scheduling:
    """How a model's sentences are batched and decoded (the serve options of the same names).

    Attributes:
        lanes: lane processes (batches decoded at the same time, one torch thread each).
        batch_size: sentences per batch at most; max_queue: sentences waiting at most.
        batch_wait: seconds sentences wait for a fuller batch under load (see above).
        max_batches: batches a lane decodes at once (they join one search, lane_process.py); 0:
            JOINED_BATCHES where the model's search takes sentences between its steps, else 1
            (each batch is a search of its own there, whose steps' bookkeeping costs on its
            own: later batches wait for the lane and come fuller).
        head_start: seconds a batch of short sentences beside long ones steps alone first.
    """
    lanes: int = 1
    batch_size: int = 32
    max_queue: int = 1024
    batch_wait: float = 0.01
    max_batches: int = 0
    head_start: float = 0.5


class Batcher:
    """A queue of sentences for one model and the lanes that decode them.

    Args:
        options: build_translator's options; a lane builds the model's translator from them,
            unless ``weights`` names a file of it (written by the server) to map.
        on_batch: called with each batch's size and the seconds its sentences waited.
        on_restart: called when a lane that died has been replaced.
        pool: the server's lanes, shared with its other models; without one, the batcher
            starts ``scheduling.lanes`` lanes of its own (and stops them with itself).
    Raises LaneError when a lane does not start.
    """

    def __init__(self, options: dict, scheduling: Scheduling = Scheduling(),
                 on_batch: Optional[Callable[[int, List[float]], None]] = None,
                 on_restart: Optional[Callable[[], None]] = None,
                 pool: Optional[LanePool] = None, weights: Optional[str] = None,
                 joinable: bool = True):
        self.options, self.head_start = options, scheduling.head_start
        self.batch_size, self.max_queue = scheduling.batch_size, scheduling.max_queue
        self.batch_wait = scheduling.batch_wait
        self.max_batches = scheduling.max_batches or (JOINED_BATCHES if joinable else 1)
        self.on_batch, self.on_restart = on_batch, on_restart
        self.pending: Deque[Job] = collections.deque()
        self.changed = threading.Condition()
        self.stopping = False
        self.running = 0  # sentences being decoded
        # (time, sentences) of recent answers: their clients' next requests are on their way
        self.answered: Deque[tuple] = collections.deque(maxlen=64)
        self.rate = 0.0  # sentences per second, a moving average (for Retry-After)
        self.ids = itertools.count()
        self.feeders: List[threading.Thread] = []
        self.lanes: List[ModelLane] = []
        self.own_pool = pool is None
        self.pool = LanePool(scheduling.lanes) if pool is None else pool
        try:
            self.key, views = self.pool.attach(
                self, ModelSource(options, weights, scheduling.head_start))
        except LaneError:
            if self.own_pool:
                self.pool.stop()
            raise
        for view in views:
            self._add(view)

    def _add(self, lane: ModelLane, restarted: bool = False) -> None:
        """Serves ``lane``: a thread feeds it batches (the pool's collects its results)."""
        with self.changed:
            if self.stopping:
                return
            self.lanes.append(lane)
            feeder = threading.Thread(target=self._feed, args=(lane,), daemon=True)
            self.feeders.append(feeder)
            feeder.start()
            self.changed.notify_all()
        if restarted and self.on_restart is not None:
            self.on_restart()

    # -- the request side -----------------------------------------------------------------
    def submit(self, sentences: List[List[str]], settings: Settings) -> List[Future]:
        """Queues each sentence's tokens (none empty); one Future per sentence. Raises
        QueueFull, or Stopped once the batcher stops."""
        futures = [Future() for _ in sentences]
        with self.changed:
            if self.stopping or not (self.lanes or self.pool.alive()):
                raise Stopped("the model is stopping")
            if len(self.pending) + len(sentences) > self.max_queue:
                raise QueueFull(self.retry_after())
            now = time.monotonic()
            self.pending.extend(Job(tokens, settings, future, now)
                                for tokens, future in zip(sentences, futures))
            self.changed.notify_all()
        return futures

    def abandon(self, futures: List[Future]) -> None:
        """Drops the sentences of ``futures`` (their client has gone): those waiting leave the
        queue; their lanes drop those that decode (where its search allows, their rows stop)."""
        gone = set(futures)
        drops = []
        with self.changed:
            dropped = [job for job in self.pending if job.future in gone]
            self.pending = collections.deque(job for job in self.pending
                                             if job.future not in gone)
            for job in dropped:
                job.over = True
            for lane in self.lanes:
                for batch_id, (batch, _) in lane.active.items():
                    places = [i for i, job in enumerate(batch)
                              if job.future in gone and _claim(job)]
                    if places:
                        drops.append((lane, batch_id, places))
                        dropped.extend(batch[i] for i in places)
                        self.running -= len(places)
            self.changed.notify_all()
        for job in dropped:
            _settle(job.future, error=CancelledError())
        for lane, batch_id, places in drops:
            lane.drop(batch_id, places)

    def retry_after(self) -> int:
        """Seconds until the waiting sentences are likely done, at the recent rate."""
        waiting = len(self.pending) + self.running
        return max(1, math.ceil(waiting / self.rate)) if self.rate > 0 else 5

    def queued(self) -> int:
        return len(self.pending)

    def stop(self, drain: bool = True) -> None:
        """Stops taking sentences; the lanes finish the queued ones (``drain``) or they fail
        with Stopped; once the batches on the lanes have ended, the lanes free the model (and
        end, when they are the batcher's own)."""
        with self.changed:
            self.stopping = True
            if not drain:
                self._fail_pending(Stopped("the model stopped"))
            self.changed.notify_all()
        for feeder in list(self.feeders):  # the queue is empty
            feeder.join()
        deadline = time.monotonic() + STOP_WAIT
        with self.changed:
            while any(lane.active for lane in self.lanes) and time.monotonic() < deadline:
                self.changed.wait(0.1)
        self.pool.detach(self.key)
        with self.changed:
            self._fail_pending(Stopped("the model stopped"))
            left = [job for lane in self.lanes for batch, _ in lane.active.values()
                    for job in batch if _claim(job)]
            for lane in self.lanes:
                lane.active.clear()
            self.running -= len(left)
        for job in left:
            _settle(job.future, error=Stopped("the model stopped"))
        if self.own_pool:
            self.pool.stop()

    def _no_lanes(self) -> None:
        """Every lane has ended and none is on its way: the sentences waiting fail."""
        with self.changed:
            self._fail_pending(Stopped("no lane is left"))
            self.changed.notify_all()

    def _fail_pending(self, error: Exception) -> None:
        while self.pending:
            job = self.pending.popleft()
            job.over = True
            _settle(job.future, error=error)

    # -- each lane: a thread that feeds it, a thread that collects its results ----------------
    def _admissible(self, lane: ModelLane, now: float) -> Optional[float]:
        """0 when ``lane`` may take sentences now; else seconds to wait at most (None: until
        something changes). A sentence that was on a lane that died decodes alone, on a lane
        that decodes nothing else."""
        if not self.pending:
            return 0 if self.stopping else None
        if _decodes_alone(lane) or (self.pending[0].deaths and lane.active):
            return None
        if self.pending[0].deaths:
            return 0
        if self.stopping or len(self.pending) >= self.batch_size:
            return 0 if len(lane.active) < self.max_batches else None
        waited = now - self.pending[0].queued
        if not lane.active:  # free: at once, unless more sentences are on their way
            busy = any(other.active for other in self.lanes if other is not lane)
            expected = self.batch_size if busy else sum(
                count for done, count in self.answered if now - done < self.batch_wait)
            enough = len(self.pending) >= min(self.batch_size, max(1, expected))
            return 0 if enough or waited >= self.batch_wait else self.batch_wait - waited
        free = any(not other.active for other in self.lanes)
        if free or len(lane.active) >= self.max_batches:
            return None
        if waited >= self.batch_wait or self._short_beside(lane):
            return 0
        return self.batch_wait - waited

    def _short_beside(self, lane: ModelLane) -> bool:
        """Whether the oldest waiting sentence is at most half as long as every sentence that
        ``lane`` decodes: it steps alone there (turns.Turns), so it waits for no fuller
        batch."""
        return short_beside([len(self.pending[0].tokens)], [
            len(job.tokens) for batch, _ in lane.active.values() for job in batch
            if not job.future.done()])

    def _take(self, lane: ModelLane) -> tuple:
        """The next batch for ``lane`` (see _admissible) and its id, now among the lane's
        active ones; (None, []) once stopped and drained, or once the lane has ended."""
        with self.changed:
            while True:
                if lane not in self.lanes:
                    return None, []
                wait = self._admissible(lane, time.monotonic())
                if wait == 0 and self.pending:
                    wait = self._shared_wait(lane)
                if wait == 0:
                    if not self.pending:
                        return None, []  # stopping, nothing left
                    batch = self._batch()
                    if batch:
                        batch_id = next(self.ids)
                        lane.active[batch_id] = (batch, time.monotonic())
                        return batch_id, batch
                    continue
                self.changed.wait(wait)

    def _shared_wait(self, lane: ModelLane) -> float:
        """0 when the other models on the lanes leave ``lane`` to this one's sentences now;
        else LOOK_AGAIN. A lane that decodes another model's sentence from a dead lane takes
        nothing; a sentence from a dead lane waits for a lane that decodes nothing at all; a
        lane free to this model but busy with others leaves a batch to a lane idle for all."""
        if lane.alone_elsewhere():
            return LOOK_AGAIN
        if self.pending[0].deaths:
            return LOOK_AGAIN if lane.busy_elsewhere() else 0
        if not lane.active and lane.busy_elsewhere() and any(
                other is not lane and other.idle() for other in self.lanes):
            return LOOK_AGAIN
        return 0

    def _batch(self) -> List[Job]:
        """The oldest waiting sentence and others of its settings and a similar length (at
        most twice as long or short: a short sentence's batch never waits for long ones); a
        sentence that was on a lane that died, alone."""
        settings, length = self.pending[0].settings, len(self.pending[0].tokens)
        if self.pending[0].deaths:
            batch = [self.pending.popleft()]
            self.running += 1
            return batch
        batch, others = [], collections.deque()
        while self.pending and len(batch) < self.batch_size:
            job = self.pending.popleft()
            if job.settings != settings or not length <= 2 * len(job.tokens) <= 4 * length \
                    or job.deaths:
                others.append(job)
            elif job.future.set_running_or_notify_cancel():  # not cancelled (timed out)
                batch.append(job)
        self.pending.extendleft(reversed(others))
        self.running += len(batch)
        return batch

    def _feed(self, lane: ModelLane) -> None:
        while True:
            batch_id, batch = self._take(lane)
            if not batch:
                return
            settings = batch[0].settings
            try:
                lane.send(batch_id, [job.tokens for job in batch], settings.n_best,
                          settings.attention)
            except (BrokenPipeError, OSError):
                return  # the collector reports the lane's end
            if self.on_batch is not None:
                self.on_batch(len(batch), [time.monotonic() - job.queued for job in batch])

    def _received(self, lane: ModelLane, message: tuple) -> None:
        """A lane's message about a batch of this model (pool.py reads them)."""
        if message[0] == "sentence":  # answered as soon as it ends
            _, batch_id, index, result = message
            with self.changed:
                entry = lane.active.get(batch_id)
                job = entry[0][index] if entry is not None else None
                answer = job is not None and _claim(job)
                if answer:
                    self.running -= 1
                    self.answered.append((time.monotonic(), 1))
                    self.changed.notify_all()
            if answer:
                _settle(job.future, result)
            return
        kind, batch_id, payload = message
        with self.changed:
            if batch_id not in lane.active:
                return  # the model stopped meanwhile
            batch, started = lane.active.pop(batch_id)
            left = [job for job in batch if _claim(job)]
            self.running -= len(left)
            rate = len(batch) * len(self.lanes) / max(time.monotonic() - started, 1e-6)
            self.rate = rate if self.rate == 0 else 0.8 * self.rate + 0.2 * rate
            if left:
                self.answered.append((time.monotonic(), len(left)))
            self.changed.notify_all()
        if kind != "done" and left:
            logger.error("a batch of %d sentences failed: %s", len(batch), payload)
        for i, job in enumerate(batch):
            if job not in left:
                continue
            if kind == "done":
                _settle(job.future, payload[i])
            else:
                _settle(job.future, error=SentenceFailed(payload))

    def _lane_ended(self, lane: ModelLane, how: str) -> None:
        """A lane ended unasked (the pool replaces it): the sentences it held decode again,
        each alone; those that have ended MAX_LANE_DEATHS lanes fail."""
        with self.changed:
            if lane in self.lanes:
                self.lanes.remove(lane)
            held = [job for batch, _ in lane.active.values() for job in batch if not job.over]
            lane.active.clear()
            self.running -= len(held)
            if self.stopping:
                failed, retried = held, []
            else:
                for job in held:
                    job.deaths += 1
                failed = [job for job in held if job.deaths >= MAX_LANE_DEATHS]
                retried = [job for job in held if job.deaths < MAX_LANE_DEATHS]
                self.pending.extendleft(reversed(retried))
            for job in failed:
                job.over = True
            self.changed.notify_all()
        if self.stopping:
            for job in failed:
                _settle(job.future, error=Stopped(f"the lane process ended ({how})"))
            return
        if held:
            logger.error("a lane process ended (%s) while decoding %d sentences: %d decode "
                         "again, each alone; %d failed", how, len(held), len(retried),
                         len(failed))
        for job in failed:
            _settle(job.future, error=SentenceFailed(
                f"the sentence ended {job.deaths} lane processes, the last time decoded alone "
                f"({how}): not retried"))


def _claim(job: Job) -> bool:
    """Whether this thread answers ``job`` (called locked): only the first that asks does."""
    if job.over:
        return False
    job.over = True
    return True


def _decodes_alone(lane: ModelLane) -> bool:
    """Whether ``lane`` decodes a sentence that was on a lane that died (it takes no other)."""
    return any(job.deaths for batch, _ in lane.active.values() for job in batch)


def _settle(future: Future, result=None, error: Optional[BaseException] = None) -> None:
    """Sets a sentence's result or error, unless it has one (its client has gone)."""
    if future.done():
        return
    if not future.running() and not future.set_running_or_notify_cancel():
        return  # cancelled while waiting
    try:
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
    except Exception:  # noqa: BLE001 - settled meanwhile by another thread
        pass
