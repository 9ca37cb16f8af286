"""The server's lane processes (lanes.py), shared by all its models.

One set of lanes (serve -lanes, one per core) decodes for every model: a model's Batcher keeps
its own queue and scheduling, and sees each lane through a ModelLane, which holds the batches of
that model the lane decodes. Every lane loads a model as soon as it is attached (a new lane,
every model attached) and frees it when the model is detached. A thread per lane reads its
results and hands each to its model's Batcher.

A lane that dies (killed, out of memory, crashed) is replaced after a back-off (RESTART_DELAY,
doubled for each other lane that died within RESTART_WINDOW, at most MAX_RESTART_DELAY), and
each model that had sentences on it decodes them again (batcher.py); the replacement serves
every model attached.
"""
import collections
import itertools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Deque, Dict, List, Optional

from onmt_lite.serve.lanes import Lane, LaneError, ModelSource

logger = logging.getLogger("onmt_lite")

# Lanes that end within RESTART_WINDOW seconds of each other double the wait before the next
# restart, from RESTART_DELAY up to MAX_RESTART_DELAY seconds: a lane that dies at once (a broken
# machine) is not restarted in a loop.
RESTART_DELAY, MAX_RESTART_DELAY, RESTART_WINDOW = 0.25, 30.0, 60.0


class ModelLane:
    """One model's view of a shared lane: ``active``, the batches of that model it decodes
    (batch id -> (its jobs, when it started)); ``peers``, every model's view of the lane."""

    def __init__(self, lane: Lane, key, source: ModelSource, batcher, peers: dict):
        self.lane, self.key, self.source, self.batcher = lane, key, source, batcher
        self.peers = peers  # key -> ModelLane, kept by the pool
        self.active: dict = {}

    @property
    def process(self):
        return self.lane.process

    def send(self, batch_id: int, tokens: List[List[str]], n_best: int, attention: bool):
        self.lane.send(self.key, self.source, batch_id, tokens, n_best, attention)

    def drop(self, batch_id: int, indices: List[int]) -> None:
        self.lane.drop(self.key, batch_id, indices)

    def others(self) -> List["ModelLane"]:
        return [view for view in list(self.peers.values()) if view is not self]

    def busy_elsewhere(self) -> bool:
        """Whether the lane decodes batches of other models."""
        return any(view.active for view in self.others())

    def alone_elsewhere(self) -> bool:
        """Whether the lane decodes another model's sentence that was on a lane that died
        (it then takes nothing else, of any model)."""
        return any(job.deaths for view in self.others()
                   for batch, _ in list(view.active.values()) for job in batch)

    def idle(self) -> bool:
        """Whether the lane decodes nothing, of any model."""
        return not any(view.active for view in list(self.peers.values()))


def _start_lanes(count: int) -> List[Lane]:
    """``count`` lanes started side by side (each ~1.2 s: an interpreter and torch); raises the
    first LaneError once the others have stopped."""
    with ThreadPoolExecutor(max(count, 1), thread_name_prefix="onmt_lite-lane-start") as pool:
        futures = [pool.submit(Lane) for _ in range(count)]
    lanes = [f.result() for f in futures if f.exception() is None]
    failed = [f.exception() for f in futures if f.exception() is not None]
    if failed:
        for lane in lanes:
            lane.stop()
        raise failed[0]
    return lanes


class LanePool:
    """``lanes`` lane processes that decode for every model attached. Raises LaneError when a
    lane does not start."""

    def __init__(self, lanes: int, first: Optional[Lane] = None):
        """``first``: a lane already started (the process that built the first model), one of
        the ``lanes``."""
        self.lock = threading.Lock()
        self.lanes: List[Lane] = []
        self.views: Dict[Lane, dict] = {}  # lane -> model key -> ModelLane
        self.models: Dict[object, tuple] = {}  # key -> (batcher, source)
        self.keys = itertools.count()
        self.deaths: Deque[float] = collections.deque(maxlen=16)  # when lanes died
        self.restarting: List[threading.Thread] = []
        self.collectors: List[threading.Thread] = []
        self.stopping = False
        self.stopped = threading.Event()  # wakes restarts waiting out their back-off
        started = [first] if first is not None else []  # (the caller's to stop on an error)
        started += _start_lanes(lanes - len(started))  # side by side: each starts torch
        with self.lock:
            for lane in started:
                self._add(lane)

    def _add(self, lane: Lane) -> List[ModelLane]:
        """Serves ``lane`` (called locked): a thread collects its results; the views of it
        of every model attached, for their batchers to add."""
        self.lanes.append(lane)
        peers = self.views[lane] = {}
        for key, (batcher, source) in self.models.items():
            peers[key] = ModelLane(lane, key, source, batcher, peers)
            lane.preload(key, source)
        collector = threading.Thread(target=self._collect, args=(lane,), daemon=True)
        self.collectors.append(collector)
        collector.start()
        return list(peers.values())

    def attach(self, batcher, source: ModelSource) -> tuple:
        """Serves a model's batches: (its key, its view of each lane)."""
        with self.lock:
            if self.stopping:
                raise LaneError("the lanes are stopping")
            key = next(self.keys)
            self.models[key] = (batcher, source)
            views = []
            for lane in self.lanes:
                peers = self.views[lane]
                peers[key] = ModelLane(lane, key, source, batcher, peers)
                views.append(peers[key])
                lane.preload(key, source)  # each lane loads it now, beside the others
        return key, views

    def detach(self, key) -> None:
        """Stops serving a model: each lane frees it (its batches ended or abandoned)."""
        with self.lock:
            self.models.pop(key, None)
            lanes = list(self.lanes)
            for lane in lanes:
                self.views[lane].pop(key, None)
        for lane in lanes:
            lane.unload(key)

    def alive(self) -> bool:
        """Whether some lane serves, or one is on its way."""
        return bool(self.lanes or self.restarting)

    def stop(self) -> None:
        """Ends the lanes once they have finished their batches."""
        with self.lock:
            self.stopping = True
        self.stopped.set()
        for thread in list(self.restarting):
            thread.join()
        for lane in list(self.lanes):
            lane.stop()
        for collector in list(self.collectors):
            if collector is not threading.current_thread():
                collector.join()

    def _collect(self, lane: Lane) -> None:
        while True:
            try:
                message = lane.receive()
            except LaneError:
                self._lane_ended(lane)
                return
            view = self.views.get(lane, {}).get(message[1])
            if view is not None:  # else: a model detached meanwhile
                view.batcher._received(view, (message[0],) + tuple(message[2:]))

    def _lane_ended(self, lane: Lane) -> None:
        """A lane that ends unasked is replaced after a back-off; each model's batcher takes
        back the sentences it held there."""
        how = lane.ended()
        with self.lock:
            if lane in self.lanes:
                self.lanes.remove(lane)
            views = list(self.views.pop(lane, {}).values())
            if not self.stopping:
                self._restart_later()
        if not self.stopping:
            logger.error("a lane process ended (%s); %d models were served on it", how,
                         len(views))
        for view in views:
            view.batcher._lane_ended(view, how)

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
                lane = Lane()
            except LaneError as err:
                logger.error("a lane did not restart: %s", err)
                with self.lock:
                    if not self.stopping:
                        self._restart_later()
                return
            with self.lock:
                views = None if self.stopping else self._add(lane)
            if views is None:
                lane.stop()  # the server stopped meanwhile
                return
            logger.info("a lane restarted (%d lanes)", len(self.lanes))
            for view in views:
                view.batcher._add(view, restarted=True)
        finally:
            with self.lock:
                self.restarting.remove(threading.current_thread())
                gone = not self.lanes and not self.restarting
                batchers = [batcher for batcher, _ in self.models.values()]
            if gone:
                for batcher in batchers:
                    batcher._no_lanes()
