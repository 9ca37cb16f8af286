"""Programs compiled ahead of time (aot.py): a package's program gives the module's outputs
for tensors and lists of tensors, serves several threads at once, lets go of the interpreter
lock while it runs, and keeps one copy of its weights in memory."""
import os
import sys
import threading
import time

import pytest
import torch
from torch import nn

from onmt_lite.models import aot

pytestmark = pytest.mark.skipif(aot.compiler_problem() is not None, reason="no C++ compiler here")


class Chain(nn.Module):
    """x @ w + sum(extra) (w: 4 MiB), x's row sums (a list among the arguments, several
    outputs), and a chain of (rows, rows) products: at 512 rows, a call long enough (about
    0.1 s) for another thread to be seen running meanwhile."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(64, 16384))

    def forward(self, x, extra):
        square = torch.tanh(x @ x.T * 0.01)
        for _ in range(6):
            square = torch.tanh(square @ square * 0.01)
        return x @ self.w + extra[0] + extra[1], x.sum(1), square.sum(1)


def arguments(rows: int) -> tuple:
    return torch.randn(rows, 64), [torch.randn(rows, 16384), torch.randn(rows, 16384)]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("compiled"))


@pytest.fixture(scope="module")
def chain(cache):
    torch.manual_seed(0)
    module = Chain().eval()
    rows = torch.export.Dim("rows", min=2, max=1024)
    return module, aot.aot_compiler(cache)(module, arguments(3), lambda: {
        "x": {0: rows}, "extra": [{0: rows}, {0: rows}]}, "chain-test")


def test_a_cached_program_loads_without_its_shapes_and_a_missing_one_is_said(chain, cache):
    """Dynamic shapes are made only to compile (they import sympy: 0.3 s of a start); a
    builder that only loads says which program the cache lacks."""
    module, _ = chain

    def no_shapes():
        raise AssertionError("shapes made for a cached program")
    again = aot.aot_compiler(cache, build_missing=False)(module, arguments(3), no_shapes,
                                                         "chain-test")
    args = arguments(2)
    with torch.no_grad():
        assert all(torch.allclose(g, w, atol=1e-4) for g, w in zip(again(*args), module(*args)))
    with pytest.raises(aot.NotInCache, match="other-test is not in the compile cache"):
        aot.aot_compiler(cache, build_missing=False)(module, arguments(3), no_shapes,
                                                     "other-test")


def test_a_program_gives_the_modules_outputs_to_several_threads_at_once(chain):
    module, program = chain
    inputs = [arguments(rows) for rows in (2, 5, 64)]
    with torch.no_grad():
        expected = [module(*args) for args in inputs]
    failures = []

    def check(times):
        for _ in range(times):
            for args, want in zip(inputs, expected):
                got = program(*args)
                if len(got) != 3 or not all(torch.allclose(g, w, atol=1e-4)
                                            for g, w in zip(got, want)):
                    failures.append(got)

    threads = [threading.Thread(target=check, args=(50,)) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures
    check(1)  # its inputs are still the caller's, unchanged
    assert not failures


def test_a_program_lets_other_threads_run_while_it_runs(chain):
    """Two -inter_threads batches' compiled steps run side by side only if a call lets go of
    the interpreter lock: while one thread is inside the program, the main thread counts on
    (measured: 0.98 of its speed alone; by a call that holds the lock throughout: 0.09)."""
    _, program = chain
    args = arguments(512)
    program(*args)
    count, inside, done = [0], [], threading.Event()

    def call():
        for _ in range(5):
            before, start = count[0], time.perf_counter()
            program(*args)
            inside.append((count[0] - before, time.perf_counter() - start))
        done.set()

    alone, stop = [0], threading.Event()  # the main thread's counting speed on its own
    timer = threading.Timer(0.2, stop.set)
    start = time.perf_counter()
    timer.start()
    while not stop.is_set():
        alone[0] += 1
    rate = alone[0] / (time.perf_counter() - start)
    interval, threads = sys.getswitchinterval(), torch.get_num_threads()
    sys.setswitchinterval(0.0005)
    torch.set_num_threads(1)  # the program's products on one core, the counting on another
    try:
        worker = threading.Thread(target=call)
        worker.start()
        while not done.is_set():
            count[0] += 1
        worker.join()
    finally:
        sys.setswitchinterval(interval)
        torch.set_num_threads(threads)
    counted = sum(c for c, _ in inside)
    seconds = sum(s for _, s in inside)
    assert counted > 0.3 * rate * seconds, (counted, rate, seconds)


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads Linux's /proc")
def test_a_programs_weights_are_in_memory_once(chain):
    """The container copies the constants out of the library's image; the image's pages of
    them leave memory (else each process would hold the weights twice)."""
    smaps = _resident_kib_of_unlinked_libraries()
    assert smaps, "no library of a program is mapped"
    assert sum(smaps.values()) < 1024, smaps  # of the 4 MiB of w


def _resident_kib_of_unlinked_libraries() -> dict:
    """Resident KiB of each mapped library whose file is gone (the programs' unpacked ones)."""
    resident, current = {}, None
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if not fields[0].endswith(":"):  # a mapping: address range, ..., [path]
                current = fields[5] if len(fields) > 6 and fields[6] == "(deleted)" and \
                    fields[5].endswith(".so") else None
            elif current and fields[0] == "Rss:":
                resident[current] = resident.get(current, 0) + int(fields[1])
    return resident
