"""A SIGKILL of the parent ends its children: translate.py's forked workers (the default layout
and -workers N) and the server's lanes are gone within seconds, not left holding memory and the
run's files (parent_watch.py)."""
import os
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "data", "multi30k_en_de_raw.pt")
DEMO = open(os.path.join(ROOT, "data", "demo.en"), encoding="utf-8").read().splitlines()


def children(pid: int) -> list:
    """The live processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()  # after "pid (name) "
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"  # a zombie has ended (init has yet to reap it)


def kill_parent_once_it_has(command, count: int, cwd=ROOT, timeout=120) -> list:
    """Runs ``command``, SIGKILLs it once it has ``count`` children, and returns the children
    still alive 3 s later."""
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + timeout
        while len(children(process.pid)) < count:
            assert process.poll() is None, process.stderr.read().decode()
            assert time.monotonic() < deadline, f"no {count} children in {timeout} s"
            time.sleep(0.05)
        time.sleep(0.5)  # the children are at work
        kids = children(process.pid)
        process.send_signal(signal.SIGKILL)
        process.wait()
        time.sleep(3)
        return [pid for pid in kids if alive(pid)]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.fixture
def big_input(tmp_path):
    path = tmp_path / "big.en"
    path.write_text("\n".join(DEMO * 100) + "\n", encoding="utf-8")
    return str(path)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="the default layout forks workers only on a machine of 2 cores or more")
def test_the_default_layouts_workers_end_with_a_killed_run(big_input, tmp_path):
    left = kill_parent_once_it_has([sys.executable, "translate.py", "-model", MODEL, "-src",
                                    big_input, "-output", str(tmp_path / "out.de")], 2)
    assert left == []


def test_workers_end_with_a_killed_run(big_input, tmp_path):
    left = kill_parent_once_it_has([sys.executable, "translate.py", "-model", MODEL, "-src",
                                    big_input, "-output", str(tmp_path / "out.de"),
                                    "-workers", "2"], 2)
    assert left == []


def test_the_servers_lanes_end_with_a_killed_server():
    pytest.importorskip("uvicorn", reason="the server needs the serve extra")
    left = kill_parent_once_it_has([sys.executable, "-m", "onmt_lite", "serve", "-model", MODEL,
                                    "-src_lang", "en", "-tgt_lang", "de", "-port", "0",
                                    "-lanes", "2"], 2)
    assert left == []
