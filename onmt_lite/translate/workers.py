"""Worker processes: batches decoded by forked copies of a Translator (``-workers N``).

Forked children share the parent's weights (copy-on-write: the pages are never written) and
each keeps its own decoder state; with processes instead of threads the interpreter lock no
longer serialises the Python side of decoding. Each runs one torch thread: a child of a process
that ran OpenMP's thread pool would hang in its own (GNU OpenMP is not fork-safe), and the
processes are the parallelism. Batches are cut as in one process and results come back in
batch order, so the output is the one-process, one-thread output, byte for byte.

One pool serves a whole run, every shard of the input, forked before any input is read: the
pages the children share with the parent are then the model and the interpreter, not lines the
parent frees and reuses (each such write copies a shared page). Before the fork every object of
the parent is frozen out of the garbage collector (``gc.freeze``): a child's collections would
otherwise write into each inherited object's header, and copy the parent's heap page by page
over a long run.
"""
import gc
import multiprocessing
import os
import signal
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Iterable, Iterator, List, Optional

import torch

from onmt_lite.errors import WorkerError
from onmt_lite.parent_watch import end_with_parent

_translator = None  # the Translator the children inherit through fork


def _start(parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the pool on Ctrl-C
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # and ends it with SIGTERM
    end_with_parent(parent)  # and a SIGKILL of the parent ends it too
    torch.set_num_threads(1)


def _translate(args):
    return _translator._translate_batch(*args)


def _only_its_lines(indices, src_tokens, tgt_tokens, offset):
    """A batch's arguments with only its own lines (a dict by line index), so a task does not
    carry its whole shard to the child."""
    tgt = None if tgt_tokens is None else {i: tgt_tokens[i] for i in indices}
    return indices, {i: src_tokens[i] for i in indices}, tgt, offset


class WorkerPool:
    """``workers`` forked processes decoding batches for ``translator``; a context manager that
    forks them on entry and ends them on exit."""

    def __init__(self, translator, workers: int):
        if "fork" not in multiprocessing.get_all_start_methods():
            raise ValueError("-workers needs processes started by fork (Linux, macOS)")
        self.translator, self.workers = translator, workers
        self.pool: Optional[ProcessPoolExecutor] = None

    def __enter__(self) -> "WorkerPool":
        global _translator
        _translator = self.translator
        gc.freeze()
        self.pool = ProcessPoolExecutor(self.workers, multiprocessing.get_context("fork"),
                                        _start, (os.getpid(),))
        self.pool.submit(int).result()  # forks every worker now (fork pools start all at once)
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:  # queued batches are dropped, not waited for
            self.pool.shutdown(cancel_futures=True)
            self.pool = None
            gc.unfreeze()

    def map(self, batches: Iterable[tuple]) -> Iterator[List]:
        """``translator._translate_batch(*args)`` for each batch; yields the results in batch
        order. A worker that dies ends the run with a WorkerError, never a wait for its batch."""
        tasks = [_only_its_lines(*args) for args in batches]
        try:
            yield from self.pool.map(_translate, tasks)
        except BrokenProcessPool:
            raise WorkerError("-workers: a worker process ended without finishing its batch "
                              "(killed, out of memory or crashed)") from None
