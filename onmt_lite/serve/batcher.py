"""Sentences from many requests, decoded in shared batches, batches interleaved step by step.

Every request's sentences join one queue per model. Each lane (a thread with its own decoder
state, the weights shared, as ``-inter_threads`` runs batches) takes the oldest waiting sentence
and every other waiting sentence that decodes with the same settings, up to ``batch_size``, and
decodes them as one batch. Nothing waits for a batch to fill when the lanes are free: one client
alone gets its sentence at once, and 32 clients together get batches.

A lane runs several batches at once, one decoder step at a time each (the search is a step
generator, search/loop.py): sentences that arrive while a long batch decodes start their own
batch at the next step boundary instead of waiting for the long one to end. The lane steps the
batch that has used the least decoding time, and a batch that joins starts ``head_start``
seconds behind the others, so a short request runs first and then shares the lane fairly.

A sentence decodes as ``translate.py`` decodes it in a batch of the same sentences; the one rule
of OpenNMT-py's search that depends on the other sentences of a batch is the length limit of
``-max_length_ratio`` (the batch's longest source x ratio + 5).
"""
import collections
import copy
import dataclasses
import logging
import math
import threading
import time
from concurrent.futures import Future
from typing import Callable, Deque, List, Optional

import torch

from onmt_lite.models.ensemble import EnsembleModel
from onmt_lite.models.model import inference, replica

logger = logging.getLogger("onmt_lite")


class QueueFull(Exception):
    """More sentences than the queue holds; ``retry_after``: seconds until it likely has room."""

    def __init__(self, retry_after: int):
        super().__init__(f"the queue is full; retry in {retry_after} s")
        self.retry_after = retry_after


class Stopped(Exception):
    """The model stopped (unloaded or the server is shutting down) before the sentence ran."""


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a request may choose per sentence; sentences share a batch only with equal ones."""
    n_best: int = 1
    attention: bool = False  # keep each hypothesis' attention (the web page's picture)


@dataclasses.dataclass
class Job:
    tokens: List[str]
    settings: Settings
    future: Future
    queued: float


class Batcher:
    """A queue of sentences and the lanes that decode them for one Translator.

    Args:
        translator: decodes (its model is shared by the lanes, each with its own decoder).
        lanes: batches decoded at the same time (threads of one torch thread each when more
            than one; one lane uses every core).
        batch_size: sentences per batch at most; max_queue: sentences waiting at most.
        batch_wait: seconds a free lane waits for a fuller batch while another lane decodes
            (under load, the answers of one batch bring the next requests a moment later);
            with every lane free a sentence never waits.
        max_batches: batches a lane decodes at once, step by step.
        head_start: seconds of decoding a batch that joins a busy lane may use before it shares
            the lane with the batches that were there.
        on_batch: called with each batch's size and the seconds its sentences waited.
    """

    def __init__(self, translator, lanes: int = 1, batch_size: int = 32, max_queue: int = 1024,
                 on_batch: Optional[Callable[[int, List[float]], None]] = None,
                 batch_wait: float = 0.0, max_batches: int = 4, head_start: float = 0.5):
        self.translator, self.batch_size, self.max_queue = translator, batch_size, max_queue
        self.batch_wait, self.max_batches, self.head_start = batch_wait, max_batches, head_start
        self.on_batch = on_batch
        self.pending: Deque[Job] = collections.deque()
        self.changed = threading.Condition()
        self.stopping = False
        self.running = 0  # sentences being decoded
        self.rate = 0.0  # sentences per second, a moving average (for Retry-After)
        self.lanes = [threading.Thread(target=self._lane, args=(translator,), name=f"lane-{i}",
                                       daemon=True) for i in range(lanes)]
        for lane in self.lanes:
            lane.start()

    # -- the request side -----------------------------------------------------------------
    def submit(self, sentences: List[List[str]], settings: Settings) -> List[Future]:
        """Queues each sentence's tokens (none empty); one Future per sentence, whose result is
        its Translation. Raises QueueFull, or Stopped once the batcher stops."""
        futures = [Future() for _ in sentences]
        with self.changed:
            if self.stopping:
                raise Stopped("the model is stopping")
            if len(self.pending) + len(sentences) > self.max_queue:
                raise QueueFull(self.retry_after())
            now = time.monotonic()
            self.pending.extend(Job(tokens, settings, future, now)
                                for tokens, future in zip(sentences, futures))
            self.changed.notify(len(self.lanes))
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
                while self.pending:
                    job = self.pending.popleft()
                    if job.future.set_running_or_notify_cancel():
                        job.future.set_exception(Stopped("the model stopped"))
            self.changed.notify_all()
        for lane in self.lanes:
            lane.join()

    # -- the lanes ------------------------------------------------------------------------
    def _take(self, busy: bool) -> List[Job]:
        """The oldest waiting sentence and the others of its settings, up to batch_size;
        cancelled ones (their request timed out or left) are dropped. A lane with batches of its
        own (``busy``) does not wait, and takes sentences only once the oldest has waited
        batch_wait or a batch's worth wait. [] when there is nothing to take (once stopped, or
        for a busy lane)."""
        with self.changed:
            deadline = None
            while True:
                while not self.pending and not self.stopping and not busy:
                    self.changed.wait()
                if not self.pending:
                    return []
                now = time.monotonic()
                if len(self.pending) < self.batch_size and not self.stopping:
                    if busy and now - self.pending[0].queued < self.batch_wait:
                        return []
                    if not busy and self.running:  # under load: a fuller batch in a moment
                        deadline = deadline or now + self.batch_wait
                        if deadline > now:
                            self.changed.wait(deadline - now)
                            continue
                settings = self.pending[0].settings
                batch, others = [], collections.deque()
                while self.pending and len(batch) < self.batch_size:
                    job = self.pending.popleft()
                    if job.settings != settings:
                        others.append(job)
                    elif job.future.set_running_or_notify_cancel():
                        batch.append(job)
                self.pending.extendleft(reversed(others))
                if batch:
                    self.running += len(batch)
                    return batch
                if busy:
                    return []

    def _lane(self, translator) -> None:
        if len(self.lanes) > 1:
            torch.set_num_threads(1)
        variants, active = {}, []
        while True:
            if len(active) < self.max_batches:
                batch = self._take(busy=bool(active))
                if batch:
                    settings = batch[0].settings
                    if settings not in variants:
                        variants[settings] = _variant(translator, settings)
                    least = min((b.used for b in active), default=0.0)
                    active.append(_Batch(variants[settings], batch,
                                         max(0.0, least - self.head_start)))
                    if self.on_batch is not None:
                        self.on_batch(len(batch), [time.monotonic() - job.queued
                                                   for job in batch])
            if not active:
                if self.stopping:
                    return
                continue
            running = min(active, key=lambda b: b.used)
            start = time.monotonic()
            try:
                with inference():
                    done = running.step()
            except Exception as err:  # noqa: BLE001 - a batch that fails fails its sentences
                logger.exception("a batch of %d sentences failed", len(running.jobs))
                for job in running.jobs:
                    job.future.set_exception(err)
                done = True
            running.used += time.monotonic() - start
            if done:
                active.remove(running)
                elapsed = max(time.monotonic() - running.started, 1e-6)
                with self.changed:
                    self.running -= len(running.jobs)
                    rate = len(running.jobs) * len(self.lanes) / elapsed
                    self.rate = rate if self.rate == 0 else 0.8 * self.rate + 0.2 * rate


class _Batch:
    """A batch a lane decodes, step by step, with a decoder of its own."""

    def __init__(self, translator, jobs: List[Job], used: float):
        self.jobs, self.used, self.started = jobs, used, time.monotonic()
        twin = copy.copy(translator)  # its own decoder state: other batches step in between
        model = translator.model
        twin.model = model.replica() if isinstance(model, EnsembleModel) else replica(model)
        # as translate.py cuts batches: by source length (stable), so that padding is alike
        self.order = sorted(range(len(jobs)), key=lambda i: len(jobs[i].tokens))
        tokens = [jobs[i].tokens for i in self.order]
        self.steps = twin.batch_steps(list(range(len(tokens))), tokens, None)

    def step(self) -> bool:
        """One decoder step; True once the batch is done (its futures then hold results)."""
        try:
            next(self.steps)
            return False
        except StopIteration as end:
            for i, translation in zip(self.order, end.value):
                self.jobs[i].future.set_result(translation)
            return True


def _variant(translator, settings: Settings):
    """The lane's translator with a request's own settings (its weights and decoder shared)."""
    opt = translator.opt
    if settings.n_best == opt.n_best and settings.attention == opt.keep_attention:
        return translator
    twin = copy.copy(translator)
    twin.opt = dataclasses.replace(opt, n_best=settings.n_best,
                                   keep_attention=settings.attention or opt.replace_unk)
    return twin
