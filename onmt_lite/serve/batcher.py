"""Sentences from many requests, decoded in shared batches.

Every request's sentences join one queue per model. Each lane (a thread with its own decoder
state, the weights shared, as ``-inter_threads`` runs batches) takes the oldest waiting sentence
and every other waiting sentence that decodes with the same settings, up to ``batch_size``, and
decodes them as one batch. Nothing waits for a batch to fill: a lane that is free takes what is
there, so one client alone gets its sentence at once and 32 clients together get batches. With
several lanes a short request is not held behind a long batch that another lane decodes.

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
from onmt_lite.models.model import replica

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
        on_batch: called with each batch's size and the seconds its sentences waited.
    """

    def __init__(self, translator, lanes: int = 1, batch_size: int = 32, max_queue: int = 1024,
                 on_batch: Optional[Callable[[int, List[float]], None]] = None,
                 batch_wait: float = 0.0):
        self.translator, self.batch_size, self.max_queue = translator, batch_size, max_queue
        self.batch_wait = batch_wait
        self.on_batch = on_batch
        self.pending: Deque[Job] = collections.deque()
        self.changed = threading.Condition()
        self.stopping = False
        self.running = 0  # sentences being decoded
        self.rate = 0.0  # sentences per second, a moving average (for Retry-After)
        self.lanes = [threading.Thread(target=self._lane, args=(self._lane_translator(i),),
                                       name=f"lane-{i}", daemon=True) for i in range(lanes)]
        for lane in self.lanes:
            lane.start()

    def _lane_translator(self, number: int):
        if number == 0:
            return self.translator
        twin = copy.copy(self.translator)
        model = self.translator.model
        twin.model = model.replica() if isinstance(model, EnsembleModel) else replica(model)
        return twin

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
    def _take(self) -> List[Job]:
        """The oldest waiting sentence and the others of its settings, up to batch_size;
        cancelled ones (their request timed out or left) are dropped. [] once stopped."""
        with self.changed:
            deadline = None
            while True:
                while not self.pending and not self.stopping:
                    self.changed.wait()
                if not self.pending:
                    return []
                if self.running and len(self.pending) < self.batch_size and not self.stopping:
                    deadline = deadline or time.monotonic() + self.batch_wait
                    if deadline > time.monotonic():
                        self.changed.wait(deadline - time.monotonic())
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

    def _lane(self, translator) -> None:
        if len(self.lanes) > 1:
            torch.set_num_threads(1)
        variants = {}
        while True:
            batch = self._take()
            if not batch:
                return
            start = time.monotonic()
            settings = batch[0].settings
            if settings not in variants:
                variants[settings] = _variant(translator, settings)
            # as translate.py cuts batches: by source length (stable), so that padding is alike
            order = sorted(range(len(batch)), key=lambda i: len(batch[i].tokens))
            tokens = [batch[i].tokens for i in order]
            try:
                translations = variants[settings]._translate_batch(list(range(len(tokens))),
                                                                   tokens, None)
            except Exception as err:  # noqa: BLE001 - a batch that fails fails its sentences
                logger.exception("a batch of %d sentences failed", len(batch))
                for job in batch:
                    job.future.set_exception(err)
            else:
                for i, translation in zip(order, translations):
                    batch[i].future.set_result(translation)
            elapsed = max(time.monotonic() - start, 1e-6)
            with self.changed:
                self.running -= len(batch)
                rate = len(batch) * len(self.lanes) / elapsed
                self.rate = rate if self.rate == 0 else 0.8 * self.rate + 0.2 * rate
            if self.on_batch is not None:
                self.on_batch(len(batch), [start - job.queued for job in batch])


def _variant(translator, settings: Settings):
    """The lane's translator with a request's own settings (its weights and decoder shared)."""
    opt = translator.opt
    if settings.n_best == opt.n_best and settings.attention == opt.keep_attention:
        return translator
    twin = copy.copy(translator)
    twin.opt = dataclasses.replace(opt, n_best=settings.n_best,
                                   keep_attention=settings.attention or opt.replace_unk)
    return twin
