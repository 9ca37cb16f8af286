"""torchrun: workers joined by torch.distributed (gloo, loopback) write the one-process file."""
import os
import subprocess
import sys

import pytest
from conftest import ROOT, SRC_WORDS, tiny_checkpoint

from onmt_lite.translate.distributed import block


def test_blocks_are_contiguous_and_cover_every_batch():
    for count in (0, 1, 2, 7, 10):
        for size in (1, 2, 3):
            blocks = [block(count, rank, size) for rank in range(size)]
            assert [i for b in blocks for i in b] == list(range(count))


@pytest.fixture(scope="module")
def model_and_source(tmp_path_factory):
    folder = tmp_path_factory.mktemp("distributed")
    model = tiny_checkpoint(folder / "model.pt", seed=3)
    lines = [" ".join(SRC_WORDS[(i * 7 + j) % 6] for j in range(i % 9)) for i in range(25)]
    assert "" in lines  # empty lines, and 25 lines: 9 batches of 3, not divisible by 2 or 3
    src = folder / "src.txt"
    src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return model, str(src), folder


def _translate(model, src, out, batch_size, workers=None):
    command = [sys.executable, os.path.join(ROOT, "translate.py"), "-model", model, "-src", src,
               "-output", out, "-batch_size", str(batch_size), "-beam_size", "3", "-n_best",
               "2", "-threads", "1"]
    if workers:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc_per_node={workers}", *command[1:]]
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")  # loopback, whatever the host's name is
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stderr


@pytest.mark.parametrize("workers,batch_size", [(2, 3), (3, 3), (3, 20)])
def test_workers_write_the_one_process_file(model_and_source, workers, batch_size):
    """(3, 20): two batches (the lines, the empty lines) for three workers: one has none."""
    model, src, folder = model_and_source
    one, many = str(folder / f"one.{batch_size}.txt"), str(folder / f"many.{workers}.txt")
    _translate(model, src, one, batch_size)
    log = _translate(model, src, many, batch_size, workers)
    with open(one, "rb") as a, open(many, "rb") as b:
        assert a.read() == b.read()
    assert log.count("PRED SCORE") == 1 and "NB SENTENCES: 25" in log  # rank 0's, of all lines
