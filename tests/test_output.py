"""Output files: atomic replacement of regular files (mode kept), writing through links, FIFOs
and devices, refusals before the model loads, and clean stops on SIGINT / SIGTERM."""
import os
import signal
import stat
import subprocess
import sys
import threading
import time

import pytest

from onmt_lite.cli import translate as translate_cli
from onmt_lite.output import OutputError, OutputFile, check_output

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def leftovers(folder):
    return [name for name in os.listdir(folder) if name.startswith(".tmp-")]


def translate(*args) -> int:
    return translate_cli.main([str(a) for a in args])


@pytest.fixture
def src(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("red cat runs\nsmall bird\n")
    return path


# -- OutputFile -----------------------------------------------------------------------------
def test_new_file_gets_the_umask_mode(tmp_path):
    out = tmp_path / "new.txt"
    mask = os.umask(0o027)
    try:
        with OutputFile(str(out)) as f:
            f.write("x\n")
    finally:
        os.umask(mask)
    assert out.read_text() == "x\n" and stat.S_IMODE(out.stat().st_mode) == 0o640
    assert leftovers(tmp_path) == []


def test_existing_file_keeps_its_mode(tmp_path):
    out = tmp_path / "out.txt"
    out.write_text("old\n")
    os.chmod(out, 0o604)
    with OutputFile(str(out)) as f:
        f.write("new\n")
    assert out.read_text() == "new\n" and stat.S_IMODE(out.stat().st_mode) == 0o604


def test_failure_leaves_the_old_file_and_no_temporary(tmp_path):
    out = tmp_path / "out.txt"
    out.write_text("old\n")
    with pytest.raises(KeyboardInterrupt):
        with OutputFile(str(out)) as f:
            f.write("half")
            raise KeyboardInterrupt
    assert out.read_text() == "old\n" and leftovers(tmp_path) == []


def test_symlink_stays_a_link_and_its_target_is_written(tmp_path):
    target, link = tmp_path / "target.txt", tmp_path / "link.txt"
    target.write_text("old\n")
    os.chmod(target, 0o640)
    link.symlink_to(target)
    with OutputFile(str(link)) as f:
        f.write("new\n")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "new\n" and stat.S_IMODE(target.stat().st_mode) == 0o640
    assert leftovers(tmp_path) == []


def test_dev_null_is_written_through_not_replaced():
    before = os.stat("/dev/null")
    with OutputFile("/dev/null") as f:
        f.write("nothing\n")
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_ino == before.st_ino
    assert leftovers("/dev") == []


def test_read_only_file_is_refused_even_for_root(tmp_path):
    out = tmp_path / "out.txt"
    out.write_text("keep\n")
    os.chmod(out, 0o444)
    with pytest.raises(OutputError, match=r"out.txt: the file is read-only \(mode 444\)"):
        check_output(str(out))
    with pytest.raises(OutputError):
        with OutputFile(str(out)):
            pass
    assert out.read_text() == "keep\n" and stat.S_IMODE(out.stat().st_mode) == 0o444


@pytest.mark.parametrize("make, message", [
    (lambda p: p / "missing" / "out.txt", "does not exist"),
    (lambda p: p, "is a directory"),
])
def test_unwritable_paths_are_named(tmp_path, make, message):
    path = str(make(tmp_path))
    with pytest.raises(OutputError) as err:
        check_output(path)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)


# -- translate.py -----------------------------------------------------------------------------
def test_fifo_output_is_written_through(tiny_model, src, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()))
    reader.start()
    assert translate("-model", tiny_model, "-src", src, "-output", fifo) == 0
    reader.join(timeout=60)
    assert received == ["RED CAT RUNS\nSMALL BIRD\n"]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and leftovers(tmp_path) == []


def test_symlink_output_from_the_command_line(tiny_model, src, tmp_path):
    target, link = tmp_path / "real.txt", tmp_path / "pred.txt"
    link.symlink_to(target)  # dangling: the target is created
    assert translate("-model", tiny_model, "-src", src, "-output", link) == 0
    assert link.is_symlink() and target.read_text() == "RED CAT RUNS\nSMALL BIRD\n"


def test_output_checked_before_the_model_loads(src, tmp_path, capsys):
    missing_model = tmp_path / "not-loaded.pt"  # the output error comes first
    out = tmp_path / "no" / "such" / "folder" / "pred.txt"
    assert translate("-model", missing_model, "-src", src, "-output", out) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{out}: the folder" in err and "does not exist" in err
    dump = tmp_path / "ro.jsonl"
    dump.write_text("")
    os.chmod(dump, 0o400)
    assert translate("-model", missing_model, "-src", src, "-output", tmp_path / "o",
                     "-attn_dump", dump) == 1
    assert f"{dump}: the file is read-only" in capsys.readouterr().err


def _start(args, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, os.path.join(ROOT, "translate.py"), *map(str, args)],
                            cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_stops_cleanly_and_keeps_the_old_output(tiny_model, tmp_path, signum, status):
    big = tmp_path / "big.txt"
    big.write_text("red cat runs big dog sits\n" * 200000)  # minutes of work: stopped midway
    out = tmp_path / "pred.txt"
    out.write_text("the old output\n")
    proc = _start(["-model", tiny_model, "-src", big, "-output", out, "-shard_size", 2000,
                   "-batch_size", 8, "-progress"], tmp_path)
    deadline = time.time() + 60
    while time.time() < deadline and not leftovers(tmp_path):  # translating: the temp exists
        time.sleep(0.05)
    assert leftovers(tmp_path), "the translation never started"
    time.sleep(0.5)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == status, err
    last = err.strip().splitlines()[-1]
    assert last == f"translate.py: stopped by {signal.Signals(signum).name}; {out} is left as it was"
    assert "Traceback" not in err
    assert out.read_text() == "the old output\n" and leftovers(tmp_path) == []


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system")
def test_a_full_device_is_one_line_naming_the_path(tiny_model, src, capsys):
    assert translate("-model", tiny_model, "-src", src, "-output", "/dev/full") == 1
    err = capsys.readouterr().err
    assert err == "translate.py: error: /dev/full: cannot write: No space left on device\n"
