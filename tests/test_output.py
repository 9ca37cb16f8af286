"""Output files: atomic replacement of regular files (mode kept), writing through links, FIFOs
and devices, refusals before the model loads (an output that is an input, an empty path), and
clean stops on SIGINT / SIGTERM."""
import os
import select
import signal
import stat
import subprocess
import sys
import threading
import time

import pytest
from conftest import tiny_checkpoint

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


def test_a_finished_run_removes_what_killed_runs_of_its_output_left(tmp_path):
    """Only this output's temporary files whose process is gone: not a running process's,
    not another output's, not a file merely named like one."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    stale = tmp_path / f".tmp-{dead}-abcd_123-out.txt"
    running = tmp_path / f".tmp-{os.getppid()}-abcd_123-out.txt"
    other = tmp_path / f".tmp-{dead}-abcd_123-other.txt"
    lookalike = tmp_path / f".tmp-{dead}-not-random-out.txt"
    for path in (stale, running, other, lookalike):
        path.write_text("half a file")
    with OutputFile(str(tmp_path / "out.txt")) as out:
        out.write("whole\n")
    assert not stale.exists() and running.exists() and other.exists() and lookalike.exists()


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
    (lambda p: p / "file.txt" / "sub" / "out.txt", "file.txt is a file, not a folder"),
])
def test_unwritable_paths_are_named(tmp_path, make, message):
    (tmp_path / "file.txt").write_text("")
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


def test_a_fifo_source_with_a_progress_bar_is_read_once(tiny_model, src, tmp_path):
    """The bar's total counts the lines of regular files only: counting a pipe would use it up."""
    fifo, out = tmp_path / "pipe", tmp_path / "out.txt"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text(src.read_text()))
    writer.start()
    assert translate("-model", tiny_model, "-src", fifo, "-output", out, "-progress") == 0
    writer.join(timeout=60)
    assert out.read_text() == "RED CAT RUNS\nSMALL BIRD\n"


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


def _read(fd: int, seen: bytearray, until: bytes = b"", timeout: float = 300) -> None:
    """Reads ``fd`` into ``seen`` until ``until`` is in it, or, without ``until``, to its end."""
    deadline = time.monotonic() + timeout
    while not until or until not in seen:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"{until!r} not seen in {timeout} s: {bytes(seen[-2000:])!r}"
        chunk = os.read(fd, 4096)
        if not chunk:
            assert not until, f"the run ended before {until!r}: {bytes(seen[-2000:])!r}"
            return
        seen += chunk


@pytest.mark.parametrize("moment", ["waiting for input", "writing a log line"])
@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_stops_cleanly_and_keeps_the_old_output(tiny_model, tmp_path, signum, status,
                                                       moment):
    """The source is a FIFO fed one line, whose translation -verbose logs. The signal comes
    once that log line is out, while the run waits for the next source line; or, with a
    reference of 1 MB in the log line, once it has begun: standard error is read no further,
    so the run is stuck in the middle of writing it."""
    fifo = tmp_path / "src.fifo"
    os.mkfifo(fifo)
    source = os.open(fifo, os.O_RDWR)  # read and write: opens at once (Linux), and no EOF
    out = tmp_path / "pred.txt"
    out.write_text("the old output\n")
    args = ["-model", tiny_model, "-src", fifo, "-output", out, "-shard_size", 1, "-verbose"]
    if moment == "writing a log line":
        (tmp_path / "ref.txt").write_text(" ".join(["REF" * 80000] * 4) + "\n")
        args += ["-tgt", tmp_path / "ref.txt"]
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "translate.py"), *map(str, args)],
                            cwd=str(tmp_path), env={**os.environ, "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = bytearray()
    try:
        os.write(source, b"red cat runs\n")
        _read(proc.stderr.fileno(), err,
              b"PRED SCORE:" if moment == "waiting for input" else b"SENT 1:")
        assert leftovers(tmp_path), "no temporary output: the run is not writing"
        proc.send_signal(signum)
        _read(proc.stderr.fileno(), err, timeout=120)
        assert proc.wait(timeout=60) == status
    finally:
        proc.kill()
        proc.wait()
        os.close(source)
    err = err.decode()  # a log line cut short is followed by the stop's own line
    assert err.endswith(f"translate.py: stopped by {signal.Signals(signum).name}; "
                        f"{out} is left as it was\n")
    assert "Traceback" not in err and "Logging error" not in err
    assert out.read_text() == "the old output\n" and leftovers(tmp_path) == []


def cli(args, cwd, **kwargs) -> subprocess.CompletedProcess:
    """translate.py as a user runs it, in the folder ``cwd``."""
    return subprocess.run([sys.executable, os.path.join(ROOT, "translate.py"), *map(str, args)],
                          cwd=str(cwd), capture_output=True, text=True, timeout=300, **kwargs)


def files_in(folder) -> dict:
    return {name: (folder / name).read_bytes() if (folder / name).is_file() else None
            for name in sorted(os.listdir(folder))}


@pytest.fixture
def inputs(tmp_path):
    """A folder with the files of a run; model.pt is no checkpoint: refusals come before it
    loads."""
    (tmp_path / "model.pt").write_bytes(b"not a checkpoint")
    (tmp_path / "in.txt").write_text("red cat runs\n")
    (tmp_path / "ref.txt").write_text("RED CAT RUNS\n")
    (tmp_path / "run.yaml").write_text("beam_size: 2\n")
    (tmp_path / "table.txt").write_text("red|||ROT\n")
    (tmp_path / "out.txt").write_text("the old output\n")
    (tmp_path / "link.txt").symlink_to("in.txt")
    os.link(tmp_path / "in.txt", tmp_path / "hard.txt")
    return tmp_path


SAME_FILE = "{} is the same file as {}; give another {}"


@pytest.mark.parametrize("args, message", [
    (["-output", "in.txt"], SAME_FILE.format("-output in.txt", "-src in.txt", "-output")),
    (["-output", "./in.txt"], SAME_FILE.format("-output ./in.txt", "-src in.txt", "-output")),
    (["-output", "link.txt"], SAME_FILE.format("-output link.txt", "-src in.txt", "-output")),
    (["-output", "hard.txt"], SAME_FILE.format("-output hard.txt", "-src in.txt", "-output")),
    (["-src", "link.txt", "-output", "in.txt"],
     SAME_FILE.format("-output in.txt", "-src link.txt", "-output")),
    (["-attn_dump", "in.txt"], SAME_FILE.format("-attn_dump in.txt", "-src in.txt",
                                                "-attn_dump")),
    (["-attn_dump", "./out.txt"], SAME_FILE.format("-attn_dump ./out.txt", "-output out.txt",
                                                   "-attn_dump")),
    (["-output", "new.txt", "-attn_dump", "new.txt"],
     SAME_FILE.format("-attn_dump new.txt", "-output new.txt", "-attn_dump")),
    (["-tgt", "ref.txt", "-output", "ref.txt"],
     SAME_FILE.format("-output ref.txt", "-tgt ref.txt", "-output")),
    (["-config", "run.yaml", "-output", "run.yaml"],
     SAME_FILE.format("-output run.yaml", "-config run.yaml", "-output")),
    (["-replace_unk", "-phrase_table", "table.txt", "-output", "table.txt"],
     SAME_FILE.format("-output table.txt", "-phrase_table table.txt", "-output")),
    (["-output", "model.pt"], SAME_FILE.format("-output model.pt", "-model model.pt", "-output")),
    (["-src", "out.txt.journal", "-resume"],
     SAME_FILE.format("the -resume journal out.txt.journal", "-src out.txt.journal", "-output")),
], ids=["src", "src through ./", "src through a link", "src through a hard link",
        "the link as src", "dump is src", "dump is output", "dump is the new output", "tgt",
        "config", "phrase_table", "model", "journal is src"])
def test_an_output_that_is_an_input_is_refused(inputs, args, message):
    if "out.txt.journal" in args:
        (inputs / "out.txt.journal").write_text("red cat runs\n")
    before = files_in(inputs)
    run = cli(["-model", "model.pt", "-src", "in.txt", "-output", "out.txt", *args], inputs)
    assert run.returncode == 2, run.stderr
    assert run.stderr == f"translate.py: error: {message}\n"
    assert files_in(inputs) == before  # nothing written, nothing replaced


REFUSED_BEFORE_TORCH = """
import sys
from onmt_lite.cli.translate import main
status = main(sys.argv[1:])
print(status, "torch" in sys.modules)
"""


def test_a_refused_command_is_said_before_torch_loads(inputs):
    """Options and files are checked before the model's code is imported (torch alone takes
    1.5-2 s): the error comes at once."""
    run = subprocess.run([sys.executable, "-c", REFUSED_BEFORE_TORCH, "-model", "model.pt",
                          "-src", "in.txt", "-output", "in.txt"], cwd=str(inputs),
                         capture_output=True, text=True, timeout=300)
    assert run.stdout == "2 False\n", run.stderr
    assert "is the same file as -src in.txt" in run.stderr


def test_a_written_through_file_may_be_shared_but_not_standard_output(tmp_path):
    model = tiny_checkpoint(tmp_path / "model.pt")
    run = cli(["-model", model, "-src", "-", "-output", "-", "-attn_dump", "-"], tmp_path,
              input="a b c\n")
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr == ("translate.py: error: -attn_dump - and -output - would both write "
                          "standard output; give -attn_dump a file\n")
    run = cli(["-model", model, "-src", "/dev/null", "-output", "/dev/null", "-attn_dump",
               "/dev/null"], tmp_path)
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize("option", ["-output", "-attn_dump"])
def test_a_file_in_the_folder_path_is_one_line(inputs, option):
    before = files_in(inputs)
    run = cli(["-model", "model.pt", "-src", "in.txt", "-output", "out.txt",
               option, "in.txt/sub/x.txt"], inputs)
    assert run.returncode == 1
    assert run.stderr == "translate.py: error: in.txt/sub/x.txt: in.txt is a file, not a folder\n"
    assert files_in(inputs) == before


@pytest.mark.parametrize("option", ["-model", "-src", "-tgt", "-output", "-attn_dump",
                                    "-attn_plot", "-config"])
def test_an_empty_path_is_refused_by_name(inputs, option):
    args = {"-model": "model.pt", "-src": "in.txt", "-output": "out.txt", option: ""}
    before = files_in(inputs)
    run = cli([word for pair in args.items() for word in pair], inputs)
    assert run.returncode == 2
    assert run.stderr == f"translate.py: error: {option}: the path is empty\n"
    assert files_in(inputs) == before


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system")
def test_a_full_device_is_one_line_naming_the_path(tiny_model, src, capsys):
    assert translate("-model", tiny_model, "-src", src, "-output", "/dev/full") == 1
    err = capsys.readouterr().err
    assert err == "translate.py: error: /dev/full: cannot write: No space left on device\n"
