"""Programs compiled ahead of time (aot.py): a package's program gives the module's outputs
for tensors and lists of tensors, serves several threads at once, and lets go of the
interpreter lock while it runs."""
import sys
import threading
import time

import pytest
import torch
from torch import nn

from onmt_lite.models import aot

pytestmark = pytest.mark.skipif(aot.compiler_problem() is not None, reason="no C++ compiler here")


class Sums(nn.Module):
    """out = x @ w + sum(extra), and x's row sums: two outputs, a list among the arguments."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(64, 64))

    def forward(self, x, extra):
        return x @ self.w + extra[0] + extra[1], x.sum(1)


class Heavy(nn.Module):
    """Long enough a call (about 0.1 s) for another thread to be seen running meanwhile."""

    def forward(self, x):
        for _ in range(150):
            x = torch.tanh(x @ x) * 0.01
        return (x,)


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    return aot.aot_compiler(str(tmp_path_factory.mktemp("compiled")))


def test_a_program_gives_the_modules_outputs_to_several_threads_at_once(build):
    torch.manual_seed(0)
    module = Sums().eval()
    rows = torch.export.Dim("rows", min=2, max=64)
    example = (torch.randn(3, 64), [torch.randn(3, 64), torch.randn(3, 64)])
    program = build(module, example, lambda: {"x": {0: rows}, "extra": [{0: rows}, {0: rows}]},
                    "sums-test")
    inputs = [(torch.randn(n, 64), [torch.randn(n, 64), torch.randn(n, 64)])
              for n in (2, 5, 64)]
    with torch.no_grad():
        expected = [module(*args) for args in inputs]
    failures = []

    def check(times):
        for _ in range(times):
            for args, want in zip(inputs, expected):
                got = program(*args)
                if len(got) != 2 or not all(torch.allclose(g, w, atol=1e-4)
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


def test_a_program_lets_other_threads_run_while_it_runs(build):
    """Two -inter_threads batches' compiled steps run side by side only if a call lets go of
    the interpreter lock: while one thread is inside the program, the main thread counts on.
    (measured: 0.9 of its speed alone; by a call that holds the lock throughout: 0.01)."""
    program = build(Heavy().eval(), (torch.randn(256, 256),), dict, "heavy-test")
    x = torch.randn(256, 256)
    program(x)
    count, inside, done = [0], [], threading.Event()

    def call():
        for _ in range(5):
            before, start = count[0], time.perf_counter()
            program(x)
            inside.append((count[0] - before, time.perf_counter() - start))
        done.set()

    alone, stop = [0], threading.Event()  # the main thread's counting speed on its own
    timer = threading.Timer(0.2, stop.set)
    start = time.perf_counter()
    timer.start()
    while not stop.is_set():
        alone[0] += 1
    rate = alone[0] / (time.perf_counter() - start)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    try:
        worker = threading.Thread(target=call)
        worker.start()
        while not done.is_set():
            count[0] += 1
        worker.join()
    finally:
        sys.setswitchinterval(interval)
    counted = sum(c for c, _ in inside)
    seconds = sum(s for _, s in inside)
    assert counted > 0.3 * rate * seconds, (counted, rate, seconds)
