"""-resume: a run killed at any point continues from its journal to the uninterrupted file;
a journal of another source or other options is refused by name, and so is what a journal
cannot keep."""
import json
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


def _journaled(journal) -> list:
    """The input line indices of each batch journaled so far (whole lines only)."""
    try:
        with open(journal, encoding="utf-8") as f:
            entries = f.read().split("\n")[1:-1]  # after the header; the last piece unfinished
    except FileNotFoundError:
        return []
    return [[t["index"] for t in json.loads(entry)["translations"]] for entry in entries]


def _killed_run(model, src, out, *extra, until=bool) -> int:
    """Starts a -resume run and SIGKILLs it as soon as ``until`` holds for its journaled
    batches (by default: once there is one); returns how many batches the journal keeps."""
    journal = f"{out}.journal"
    run = subprocess.Popen(_command(model, src, out, *extra), stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not until(_journaled(journal)):
        assert run.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline, "no batch journaled in 300 s"
        time.sleep(0.01)
    run.send_signal(signal.SIGKILL)
    run.wait()
    assert not os.path.exists(out)  # never half a file
    return len(_journaled(journal))


def _in_the_second_shard(batches) -> bool:
    """Whether a batch of the second shard of 100 lines is journaled."""
    return any(i >= 100 for batch in batches for i in batch)


@pytest.mark.parametrize("shards", [[], ["-shard_size", "100"]], ids=["one shard", "shards"])
def test_a_killed_run_resumes_to_the_uninterrupted_file(setup, tmp_path, shards):
    """With shards, the journal's records are read back a shard at a time."""
    model, src, whole = setup
    if shards:
        assert translate_cli.main(_command(model, src, tmp_path / "whole.txt", *shards)[2:]) == 0
        whole = (tmp_path / "whole.txt").read_bytes()
    out, journal = tmp_path / "out.txt", tmp_path / "out.txt.journal"
    done = _killed_run(model, src, out, *shards, until=_in_the_second_shard if shards else bool)
    assert done >= 1
    assert [p.name for p in tmp_path.glob(".tmp-*-out.txt")]  # the killed run's, left behind
    resumed = subprocess.run(_command(model, src, out, *shards), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"{done} batches" in resumed.stderr
    assert out.read_bytes() == whole
    assert not journal.exists()  # the output replaced it
    assert list(tmp_path.glob(".tmp-*")) == []  # and the killed run's temporary file


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


@pytest.mark.parametrize("args, message", [
    (["-src", "-"], "-resume reads -src twice (its SHA-256 for the journal, then its lines): "
                    "give a regular file, not -"),
    (["-src", "/dev/stdin"], "-resume reads -src twice (its SHA-256 for the journal, then its "
                             "lines): give a regular file, not /dev/stdin"),
    (["-output", "-"], "-resume keeps its journal beside -output: give a file, not -"),
    (["-verbose"], "-resume: -verbose is not kept in the journal; run without -resume"),
    (["-attn_debug"], "-resume: -attn_debug is not kept in the journal; run without -resume"),
    (["-attn_dump", "attn.jsonl"],
     "-resume: -attn_dump is not kept in the journal; run without -resume"),
    (["-attn_plot", "plots"], "-resume: -attn_plot is not kept in the journal; run without "
                              "-resume"),
], ids=["src -", "src a pipe", "output -", "verbose", "attn_debug", "attn_dump", "attn_plot"])
def test_resume_refuses_what_it_cannot_keep(tmp_path, args, message):
    """Option errors, before the model (here no checkpoint) loads."""
    (tmp_path / "model.pt").write_bytes(b"not a checkpoint")
    (tmp_path / "src.txt").write_text("a b\n")
    run = subprocess.run([*_command("model.pt", "src.txt", "out.txt"), *args], cwd=tmp_path,
                         input="a b\n", capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr == f"translate.py: error: {message}\n"
    assert sorted(os.listdir(tmp_path)) == ["model.pt", "src.txt"]


def test_a_missing_source_is_one_line(setup, tmp_path):
    model, _, _ = setup
    run = subprocess.run(_command(model, "missing.txt", "out.txt"), cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 1
    assert run.stderr == "translate.py: error: missing.txt: cannot read: No such file or directory\n"
    assert os.listdir(tmp_path) == []
