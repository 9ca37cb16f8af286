"""-resume: a run killed at any point continues from its journal to the uninterrupted file;
a journal of another source or other options is refused by name."""
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, SRC_WORDS, tiny_checkpoint

from onmt_lite.cli import translate as translate_cli


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("resume")
    model = tiny_checkpoint(folder / "model.pt", seed=2)
    src = folder / "src.txt"
    src.write_text("".join(" ".join(SRC_WORDS[(i * 5 + j) % 6] for j in range(i % 11)) + "\n"
                           for i in range(600)), encoding="utf-8")
    whole = folder / "whole.txt"
    assert translate_cli.main(["-model", model, "-src", str(src), "-output", str(whole),
                               "-batch_size", "2", "-with_score"]) == 0
    return model, src, whole.read_bytes()


def _command(model, src, out, *extra):
    return [sys.executable, os.path.join(ROOT, "translate.py"), "-model", model, "-src",
            str(src), "-output", str(out), "-batch_size", "2", "-with_score", "-resume",
            "-threads", "1", *extra]


def _batches_in(journal) -> int:
    try:
        with open(journal, encoding="utf-8") as f:
            return max(0, sum(1 for _ in f) - 1)
    except FileNotFoundError:
        return 0


def _killed_run(model, src, out, *extra, after: int = 10) -> int:
    """Starts a -resume run, SIGKILLs it once ``after`` batches are journaled; returns how
    many are."""
    journal = f"{out}.journal"
    run = subprocess.Popen(_command(model, src, out, *extra), stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while _batches_in(journal) < after and time.time() < deadline and run.poll() is None:
        time.sleep(0.02)
    assert run.poll() is None, "the run ended before it could be killed"
    run.send_signal(signal.SIGKILL)
    run.wait()
    assert not os.path.exists(out)  # never half a file
    return _batches_in(journal)


@pytest.mark.parametrize("shards", [[], ["-shard_size", "100"]], ids=["one shard", "shards"])
def test_a_killed_run_resumes_to_the_uninterrupted_file(setup, tmp_path, shards):
    """With shards, the journal's records are read back a shard at a time."""
    model, src, whole = setup
    if shards:
        assert translate_cli.main(_command(model, src, tmp_path / "whole.txt", *shards)[2:]) == 0
        whole = (tmp_path / "whole.txt").read_bytes()
    out, journal = tmp_path / "out.txt", tmp_path / "out.txt.journal"
    done = _killed_run(model, src, out, *shards, after=120 if shards else 10)
    assert done >= 10
    resumed = subprocess.run(_command(model, src, out, *shards), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"{done} batches" in resumed.stderr
    assert out.read_bytes() == whole
    assert not journal.exists()  # the output replaced it


def test_a_torn_last_line_is_ignored(setup, tmp_path):
    model, src, whole = setup
    out, journal = tmp_path / "out.txt", tmp_path / "out.txt.journal"
    _killed_run(model, src, out)
    with open(journal, "a", encoding="utf-8") as f:  # half a batch, as a kill may leave it
        f.write('{"batch": 9999, "translations": [{"ind')
    assert translate_cli.main(_command(model, src, out)[2:]) == 0
    assert out.read_bytes() == whole


def test_another_source_or_option_is_refused_by_name(setup, tmp_path, capsys):
    model, src, _ = setup
    out, journal = tmp_path / "out.txt", tmp_path / "out.txt.journal"
    _killed_run(model, src, out)
    assert translate_cli.main(_command(model, src, out, "-beam_size", "3")[2:]) == 1
    assert "written with other options: -beam_size 5 then, 3 now" in capsys.readouterr().err
    other = tmp_path / "other.txt"
    other.write_text("red cat\n", encoding="utf-8")
    assert translate_cli.main(_command(model, other, out)[2:]) == 1
    assert "written for another -src file" in capsys.readouterr().err
    assert journal.exists() and not out.exists()


def test_resume_refuses_what_it_cannot_keep(setup, tmp_path, capsys):
    model, src, _ = setup
    assert translate_cli.main(_command(model, src, "-")[2:]) == 1
    assert "give a file, not -" in capsys.readouterr().err
    assert translate_cli.main(_command(model, src, tmp_path / "o.txt", "-verbose")[2:]) == 1
    assert "-verbose is not kept in the journal" in capsys.readouterr().err
