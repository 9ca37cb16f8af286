"""Lanes: the processes that decode the server's batches, outside its interpreter lock; here,
the server's handle on each (Lane) and what it tells a lane of a model (ModelSource).

Each lane is a process of one torch thread (started by spawn, not fork: the server has threads
by then), shared by every model of the server; what runs in it is lane_process.py. The server's
own process keeps to HTTP, tokenizing and the queue: it never imports torch (the lanes and the
process that loads each model do), and its event loop never waits on a decoding thread.
"""
import dataclasses
import multiprocessing
import os
import signal
import threading
from typing import List, Optional


class LaneError(RuntimeError):
    """A lane that failed to start, or died."""


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """How a lane loads a model: ``weights``, a file of its translator (torch.save) to map
    read-only, or else build_translator(``options``); ``head_start``: its Turns."""
    options: dict
    weights: Optional[str] = None
    head_start: float = 0.5


class Lane:
    """The server's handle on one lane process: ``send`` batches of any model, ``receive``
    their results (each message names its model's key)."""

    def __init__(self, started: Optional[tuple] = None):
        """A new lane process; or ``started``, (process, its pipe's server end): one that
        built the first model and goes on as a lane (building.py)."""
        if started is None:
            context = multiprocessing.get_context("spawn")
            self.conn, child = context.Pipe()
            self.process = context.Process(target=_lane_main, args=(child, os.getpid()),
                                           daemon=True, name="onmt_lite-lane")
            self.process.start()
            child.close()
        else:
            self.process, self.conn = started
        self.told = set()  # the keys of the models whose source the lane has
        self.sending = threading.Lock()  # batches and drops come from different threads
        try:
            message = self.conn.recv()
        except EOFError:
            message = ("failed", f"the lane process exited ({self.process.exitcode})")
        if message[0] != "ready":
            self.process.join(5)
            raise LaneError(message[1])

    def send(self, key, source: ModelSource, batch_id: int, tokens: List[List[str]],
             n_best: int, attention: bool):
        with self.sending:
            if key not in self.told:
                self.conn.send(("model", key, source))
                self.told.add(key)
            self.conn.send(("batch", key, batch_id, tokens, n_best, attention))

    def preload(self, key, source: ModelSource) -> None:
        """Asks the lane to load a model now, not at its first batch: the first requests
        after a model loads do not wait for each lane to load it."""
        try:
            with self.sending:
                if key not in self.told:
                    self.conn.send(("model", key, source))
                    self.told.add(key)
                self.conn.send(("load", key))
        except (BrokenPipeError, OSError):
            pass  # it has ended: its collector says so

    def drop(self, key, batch_id: int, indices: List[int]) -> None:
        """Asks the lane to drop sentences of a batch (their client has gone): it sends no
        result for them, and stops a search once every sentence it decodes is dropped."""
        self._tell(("drop", key, batch_id, indices))

    def unload(self, key) -> None:
        """Asks the lane to free a model (none of its batches is left)."""
        with self.sending:
            if key not in self.told:
                return
            self.told.discard(key)
        self._tell(("unload", key))

    def _tell(self, message: tuple) -> None:
        try:
            with self.sending:
                self.conn.send(message)
        except (BrokenPipeError, OSError):
            pass  # it has ended: its collector says so

    def ended(self) -> str:
        """How the lane process ended (it is reaped here): its exit status or signal."""
        self.process.join(5)
        return how_ended(self.process)

    def receive(self):
        """(kind, model key, ...): ("sentence", key, batch id, index, result) as each
        sentence ends; then ("done", key, batch id, results: None for those sent already) or
        ("error", key, batch id, message). LaneError once the process has ended."""
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            raise LaneError("the lane process ended") from None

    def stop(self) -> None:
        """Asks the lane to finish its batches and end; waits for it."""
        self._tell(("stop",))
        self.process.join(60)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


def how_ended(process) -> str:
    """A finished process's exit status or the signal that killed it ("still running" if not
    finished)."""
    code = process.exitcode
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def _lane_main(conn, server: int) -> None:
    """The lane process's start: imports torch and the decoding there, not in the server."""
    from onmt_lite.serve.lane_process import lane_main
    lane_main(conn, server)
