"""Worker processes: batches decoded by forked copies of a Translator (``-workers N``).

Forked children share the parent's weights (copy-on-write: the pages are never written) and
each keeps its own decoder state; with processes instead of threads the interpreter lock no
longer serialises the Python side of decoding. Each runs one torch thread: a child of a process
that ran OpenMP's thread pool would hang in its own (GNU OpenMP is not fork-safe), and the
processes are the parallelism. Batches are cut as in one process and results come back in
batch order, so the output is the one-process, one-thread output, byte for byte.
"""
import multiprocessing
import signal
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Iterable, Iterator, List

import torch

_translator = None  # the Translator the children inherit through fork


class WorkerError(RuntimeError):
    """A worker process ended without its batch (killed, out of memory, crashed)."""


def _start() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the pool on Ctrl-C
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # and ends it with SIGTERM
    torch.set_num_threads(1)


def _translate(args):
    return _translator._translate_batch(*args)


def _only_its_lines(indices, src_tokens, tgt_tokens, offset):
    """A batch's arguments with only its own lines (a dict by line index), so a task does not
    carry its whole shard to the child."""
    tgt = None if tgt_tokens is None else {i: tgt_tokens[i] for i in indices}
    return indices, {i: src_tokens[i] for i in indices}, tgt, offset


def run_in_processes(translator, batches: Iterable[tuple], workers: int) -> Iterator[List]:
    """``translator._translate_batch(*args)`` for each batch, on ``workers`` forked processes;
    yields the results in batch order. A worker that dies ends the run with a WorkerError,
    never a wait for its batch."""
    global _translator
    if "fork" not in multiprocessing.get_all_start_methods():
        raise ValueError("-workers needs processes started by fork (Linux, macOS)")
    _translator = translator
    pool = ProcessPoolExecutor(workers, multiprocessing.get_context("fork"), _start)
    try:
        yield from pool.map(_translate, [_only_its_lines(*args) for args in batches])
    except BrokenProcessPool:
        raise WorkerError("-workers: a worker process ended without finishing its batch "
                          "(killed, out of memory or crashed)") from None
    finally:  # a consumer that stops early does not wait for the batches still queued
        pool.shutdown(cancel_futures=True)
