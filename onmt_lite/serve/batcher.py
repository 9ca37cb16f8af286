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
takes steps alone there (lanes.Turns), so it waits for no fuller batch.

A sentence decodes as ``translate.py`` decodes it in a batch of the same sentences; the one rule
of OpenNMT-py's search that depends on the other sentences of a batch is the length limit of
``-max_length_ratio`` (the batch's longest source x ratio + 5).
"""
import collections
import dataclasses
import itertools
import logging
import math
import threading
import time
from concurrent.futures import Future
from typing import Callable, Deque, List, Optional

from onmt_lite.serve.lanes import Lane, LaneError, short_beside

logger = logging.getLogger("onmt_lite")


class QueueFull(Exception):
    """More sentences than the queue holds; ``retry_after``: seconds until it likely has room."""

    def __init__(self, retry_after: int):
        super().__init__(f"the queue is full; retry in {retry_after} s")
        self.retry_after = retry_after


class Stopped(Exception):
    """The model stopped (unloaded, the server shutting down, its lanes gone) before the
    sentence ran."""


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a request may choose per sentence; sentences share a batch only with equal ones."""
    n_best: int = 1
    attention: bool = False  # keep each hypothesis' attention (the web page's picture)


@dataclasses.dataclass
class Job:
    tokens: List[str]
    settings: Settings
    future: Future  # its result: (texts, scores, target tokens, attention rows)
    queued: float


@dataclasses.dataclass(frozen=True)
class Scheduling:
    """How a model's sentences are batched and decoded (the serve options of the same names).

    Attributes:
        lanes: lane processes (batches decoded at the same time, one torch thread each).
        batch_size: sentences per batch at most; max_queue: sentences waiting at most.
        batch_wait: seconds sentences wait for a fuller batch under load (see above).
        max_batches: batches a lane decodes at once (they join one search, lanes.py).
        head_start: seconds a batch of short sentences beside long ones steps alone first.
    """
    lanes: int = 1
    batch_size: int = 32
    max_queue: int = 1024
    batch_wait: float = 0.01
    max_batches: int = 4
    head_start: float = 0.5


class Batcher:
    """A queue of sentences and the lanes that decode them for one model.

    Args:
        options: build_translator's options; each lane process builds its translator from them.
        on_batch: called with each batch's size and the seconds its sentences waited.
    Raises LaneError when a lane does not start.
    """

    def __init__(self, options: dict, scheduling: Scheduling = Scheduling(),
                 on_batch: Optional[Callable[[int, List[float]], None]] = None):
        self.batch_size, self.max_queue = scheduling.batch_size, scheduling.max_queue
        self.batch_wait, self.max_batches = scheduling.batch_wait, scheduling.max_batches
        self.on_batch = on_batch
        self.pending: Deque[Job] = collections.deque()
        self.changed = threading.Condition()
        self.stopping = False
        self.running = 0  # sentences being decoded
        # (time, sentences) of recent answers: their clients' next requests are on their way
        self.answered: Deque[tuple] = collections.deque(maxlen=64)
        self.rate = 0.0  # sentences per second, a moving average (for Retry-After)
        self.ids = itertools.count()
        self.lanes = [Lane(options, scheduling.head_start) for _ in range(scheduling.lanes)]
        self.threads = []
        for lane in self.lanes:
            for target in (self._feed, self._collect):
                thread = threading.Thread(target=target, args=(lane,), daemon=True)
                thread.start()
                self.threads.append(thread)

    # -- the request side -----------------------------------------------------------------
    def submit(self, sentences: List[List[str]], settings: Settings) -> List[Future]:
        """Queues each sentence's tokens (none empty); one Future per sentence. Raises
        QueueFull, or Stopped once the batcher stops."""
        futures = [Future() for _ in sentences]
        with self.changed:
            if self.stopping or not self.lanes:
                raise Stopped("the model is stopping")
            if len(self.pending) + len(sentences) > self.max_queue:
                raise QueueFull(self.retry_after())
            now = time.monotonic()
            self.pending.extend(Job(tokens, settings, future, now)
                                for tokens, future in zip(sentences, futures))
            self.changed.notify_all()
        return futures

    def retry_after(self) -> int:
        """Seconds until the waiting sentences are likely done, at the recent rate."""
        waiting = len(self.pending) + self.running
        return max(1, math.ceil(waiting / self.rate)) if self.rate > 0 else 5

    def queued(self) -> int:
        return len(self.pending)

    def stop(self, drain: bool = True) -> None:
        """Stops taking sentences; the lanes finish the queued ones (``drain``) or fail them
        with Stopped, then end."""
        with self.changed:
            self.stopping = True
            if not drain:
                self._fail_pending(Stopped("the model stopped"))
            self.changed.notify_all()
        for thread in self.threads[::2]:  # the feeders: the queue is empty
            thread.join()
        for lane in list(self.lanes):
            lane.stop()
        for thread in self.threads[1::2]:
            thread.join()

    def _fail_pending(self, error: Exception) -> None:
        while self.pending:
            job = self.pending.popleft()
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(error)

    # -- each lane: a thread that feeds it, a thread that collects its results ----------------
    def _admissible(self, lane: Lane, now: float) -> Optional[float]:
        """0 when ``lane`` may take sentences now; else seconds to wait at most (None: until
        something changes)."""
        if not self.pending:
            return 0 if self.stopping else None
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

    def _short_beside(self, lane: Lane) -> bool:
        """Whether the oldest waiting sentence is at most half as long as every sentence that
        ``lane`` decodes: it steps alone there (lanes.Turns), so it waits for no fuller
        batch."""
        return short_beside([len(self.pending[0].tokens)], [
            len(job.tokens) for batch, _ in lane.active.values() for job in batch
            if not job.future.done()])

    def _take(self, lane: Lane) -> List[Job]:
        """The next batch for ``lane`` (see _admissible); [] once stopped and drained."""
        with self.changed:
            while True:
                if lane not in self.lanes:
                    return []
                wait = self._admissible(lane, time.monotonic())
                if wait == 0:
                    if not self.pending:
                        return []  # stopping, nothing left
                    batch = self._batch()
                    if batch:
                        return batch
                    continue
                self.changed.wait(wait)

    def _batch(self) -> List[Job]:
        """The oldest waiting sentence and others of its settings and a similar length (at
        most twice as long or short: a short sentence's batch never waits for long ones)."""
        settings, length = self.pending[0].settings, len(self.pending[0].tokens)
        batch, others = [], collections.deque()
        while self.pending and len(batch) < self.batch_size:
            job = self.pending.popleft()
            if job.settings != settings or not length <= 2 * len(job.tokens) <= 4 * length:
                others.append(job)
            elif job.future.set_running_or_notify_cancel():  # not cancelled (timed out)
                batch.append(job)
        self.pending.extendleft(reversed(others))
        self.running += len(batch)
        return batch

    def _feed(self, lane: Lane) -> None:
        while True:
            batch = self._take(lane)
            if not batch:
                return
            batch_id = next(self.ids)
            with self.changed:  # (its jobs, when it started)
                lane.active[batch_id] = (batch, time.monotonic())
            settings = batch[0].settings
            try:
                lane.send(batch_id, [job.tokens for job in batch], settings.n_best,
                          settings.attention)
            except (BrokenPipeError, OSError):
                return  # the collector reports the lane's end
            if self.on_batch is not None:
                self.on_batch(len(batch), [time.monotonic() - job.queued for job in batch])

    def _collect(self, lane: Lane) -> None:
        while True:
            try:
                message = lane.receive()
            except LaneError as err:
                self._lane_ended(lane, err)
                return
            if message[0] == "sentence":  # answered as soon as it ends
                _, batch_id, index, result = message
                with self.changed:
                    self.running -= 1
                    self.answered.append((time.monotonic(), 1))
                    self.changed.notify_all()
                lane.active[batch_id][0][index].future.set_result(result)
                continue
            kind, batch_id, payload = message
            with self.changed:
                batch, started = lane.active.pop(batch_id)
                left = [job for job in batch if not job.future.done()]
                self.running -= len(left)
                rate = len(batch) * len(self.lanes) / max(time.monotonic() - started, 1e-6)
                self.rate = rate if self.rate == 0 else 0.8 * self.rate + 0.2 * rate
                if left:
                    self.answered.append((time.monotonic(), len(left)))
                self.changed.notify_all()
            for i, job in enumerate(batch):
                if job.future.done():
                    continue
                if kind == "done":
                    job.future.set_result(payload[i])
                else:
                    logger.error("a batch of %d sentences failed: %s", len(batch), payload)
                    job.future.set_exception(RuntimeError(payload))

    def _lane_ended(self, lane: Lane, err: LaneError) -> None:
        """A lane that ends fails its batches; when it ended unasked, the queue too if no lane
        is left."""
        with self.changed:
            if lane in self.lanes:
                self.lanes.remove(lane)
            lost = [[job for job in batch if not job.future.done()]
                    for batch, _ in lane.active.values()]
            lane.active.clear()
            for batch in lost:
                self.running -= len(batch)
            if not self.stopping:
                logger.error("%s", err)
                if not self.lanes:
                    self._fail_pending(Stopped(str(err)))
            self.changed.notify_all()
        for batch in lost:
            for job in batch:
                job.future.set_exception(Stopped(str(err)))
