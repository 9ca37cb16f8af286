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

A lane that dies (killed, out of memory, crashed) is replaced after a back-off, and the sentences
it held are decoded again: each then alone, on a lane that decodes nothing else, so that a
sentence that ends a lane of its own doing is found; one that has ended two lanes fails with an
error that says so, and the others go on. A request whose client has gone is dropped: its
sentences that wait leave the queue, those that decode are dropped by their lane (lanes.py).
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

from onmt_lite.serve.lanes import Lane, LaneError, short_beside

logger = logging.getLogger("onmt_lite")

# Lanes that end within RESTART_WINDOW seconds of each other double the wait before the next
# restart, from RESTART_DELAY up to MAX_RESTART_DELAY seconds: a lane that dies at once (a broken
# machine) is not restarted in a loop.
RESTART_DELAY, MAX_RESTART_DELAY, RESTART_WINDOW = 0.25, 30.0, 60.0
# Lanes a sentence may end before it fails (the last time decoded alone).
MAX_LANE_DEATHS = 2


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
        on_restart: called when a lane that died has been replaced.
    Raises LaneError when a lane does not start.
    """

    def __init__(self, options: dict, scheduling: Scheduling = Scheduling(),
                 on_batch: Optional[Callable[[int, List[float]], None]] = None,
                 on_restart: Optional[Callable[[], None]] = None):
        self.options, self.head_start = options, scheduling.head_start
        self.batch_size, self.max_queue = scheduling.batch_size, scheduling.max_queue
        self.batch_wait, self.max_batches = scheduling.batch_wait, scheduling.max_batches
        self.on_batch, self.on_restart = on_batch, on_restart
        self.pending: Deque[Job] = collections.deque()
        self.changed = threading.Condition()
        self.stopping = False
        self.stopped = threading.Event()  # wakes restarts waiting out their back-off
        self.running = 0  # sentences being decoded
        # (time, sentences) of recent answers: their clients' next requests are on their way
        self.answered: Deque[tuple] = collections.deque(maxlen=64)
        self.rate = 0.0  # sentences per second, a moving average (for Retry-After)
        self.ids = itertools.count()
        self.deaths: Deque[float] = collections.deque(maxlen=16)  # when lanes died
        self.restarting: List[threading.Thread] = []
        self.threads: List[tuple] = []  # (feeder, collector) of each lane
        self.lanes: List[Lane] = []
        try:
            for _ in range(scheduling.lanes):
                self._add(Lane(options, self.head_start))
        except LaneError:
            self.stop(drain=False)
            raise

    def _add(self, lane: Lane) -> None:
        """Serves ``lane``: a thread feeds it batches, another collects its results."""
        self.lanes.append(lane)
        threads = tuple(threading.Thread(target=target, args=(lane,), daemon=True)
                        for target in (self._feed, self._collect))
        for thread in threads:
            thread.start()
        self.threads.append(threads)

    # -- the request side -----------------------------------------------------------------
    def submit(self, sentences: List[List[str]], settings: Settings) -> List[Future]:
        """Queues each sentence's tokens (none empty); one Future per sentence. Raises
        QueueFull, or Stopped once the batcher stops."""
        futures = [Future() for _ in sentences]
        with self.changed:
            if self.stopping or not (self.lanes or self.restarting):
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
        """Stops taking sentences; the lanes finish the queued ones (``drain``) or fail them
        with Stopped, then end."""
        with self.changed:
            self.stopping = True
            if not drain:
                self._fail_pending(Stopped("the model stopped"))
            self.changed.notify_all()
        self.stopped.set()
        for thread in list(self.restarting):
            thread.join()
        for feeder, _ in self.threads:  # the queue is empty
            feeder.join()
        for lane in list(self.lanes):
            lane.stop()
        for _, collector in self.threads:
            collector.join()

    def _fail_pending(self, error: Exception) -> None:
        while self.pending:
            job = self.pending.popleft()
            job.over = True
            _settle(job.future, error=error)

    # -- each lane: a thread that feeds it, a thread that collects its results ----------------
    def _admissible(self, lane: Lane, now: float) -> Optional[float]:
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

    def _short_beside(self, lane: Lane) -> bool:
        """Whether the oldest waiting sentence is at most half as long as every sentence that
        ``lane`` decodes: it steps alone there (lanes.Turns), so it waits for no fuller
        batch."""
        return short_beside([len(self.pending[0].tokens)], [
            len(job.tokens) for batch, _ in lane.active.values() for job in batch
            if not job.future.done()])

    def _take(self, lane: Lane) -> tuple:
        """The next batch for ``lane`` (see _admissible) and its id, now among the lane's
        active ones; (None, []) once stopped and drained, or once the lane has ended."""
        with self.changed:
            while True:
                if lane not in self.lanes:
                    return None, []
                wait = self._admissible(lane, time.monotonic())
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

    def _feed(self, lane: Lane) -> None:
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

    def _collect(self, lane: Lane) -> None:
        while True:
            try:
                message = lane.receive()
            except LaneError:
                self._lane_ended(lane)
                return
            if message[0] == "sentence":  # answered as soon as it ends
                _, batch_id, index, result = message
                job = lane.active[batch_id][0][index]
                with self.changed:
                    answer = _claim(job)
                    if answer:
                        self.running -= 1
                        self.answered.append((time.monotonic(), 1))
                        self.changed.notify_all()
                if answer:
                    _settle(job.future, result)
                continue
            kind, batch_id, payload = message
            with self.changed:
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

    def _lane_ended(self, lane: Lane) -> None:
        """A lane that ends unasked is replaced (after a back-off) and the sentences it held
        decode again, each alone; those that have ended MAX_LANE_DEATHS lanes fail."""
        how = lane.ended()
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
                self._restart_later()
            for job in failed:
                job.over = True
            self.changed.notify_all()
        if self.stopping:
            for job in failed:
                _settle(job.future, error=Stopped(f"the lane process ended ({how})"))
            return
        logger.error("a lane process ended (%s) while decoding %d sentences: %d decode again, "
                     "each alone; %d failed", how, len(held), len(retried), len(failed))
        for job in failed:
            _settle(job.future, error=SentenceFailed(
                f"the sentence ended {job.deaths} lane processes, the last time decoded alone "
                f"({how}): not retried"))

    def _restart_later(self) -> None:
        """Starts a thread that replaces an ended lane after the back-off (called locked)."""
        now = time.monotonic()
        self.deaths.append(now)
        recent = sum(1 for t in self.deaths if now - t < RESTART_WINDOW)
        delay = min(MAX_RESTART_DELAY, RESTART_DELAY * 2 ** (recent - 1))
        thread = threading.Thread(target=self._restart, args=(delay,), daemon=True)
        self.restarting.append(thread)
        thread.start()

    def _restart(self, delay: float) -> None:
        try:
            if self.stopped.wait(delay):
                return
            try:
                lane = Lane(self.options, self.head_start)
            except LaneError as err:
                logger.error("a lane did not restart: %s", err)
                with self.changed:
                    if not self.stopping:
                        self._restart_later()
                return
            with self.changed:
                if not self.stopping:
                    self._add(lane)
                    self.changed.notify_all()
                    lane = None
            if lane is not None:
                lane.stop()  # the model stopped meanwhile
                return
            logger.info("a lane restarted (%d lanes)", len(self.lanes))
            if self.on_restart is not None:
                self.on_restart()
        finally:
            with self.changed:
                self.restarting.remove(threading.current_thread())
                if not self.lanes and not self.restarting:
                    self._fail_pending(Stopped("no lane is left"))
                self.changed.notify_all()


def _claim(job: Job) -> bool:
    """Whether this thread answers ``job`` (called locked): only the first that asks does."""
    if job.over:
        return False
    job.over = True
    return True


def _decodes_alone(lane: Lane) -> bool:
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
