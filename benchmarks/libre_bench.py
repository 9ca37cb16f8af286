"""onmt_lite's server against LibreTranslate on the same Argos Translate package (serve_bench.py
-libretranslate VENV [-argos_packages DIR] [-rounds N]).

LibreTranslate 1.9.6 (a side virtualenv: ../shared/peers/setup-libretranslate.sh) runs offline
(../shared/peers/libretranslate-offline.sh) at its fastest setting on 2 cores,
ARGOS_INTER_THREADS=2 ARGOS_INTRA_THREADS=1; onmt_lite runs ``onmt_lite serve -argos_packages
DIR`` with no other flag. One server at a time, the first of each round alternating. Each round
measures, after a warm-up: 32 clients of one sentence and 4 clients of ten (sentences/s, closed
loops), one client's latency (the median of ``-latency_requests`` one-sentence requests), the
peak memory of the server's process tree (PeakMemory: resident, summed over its processes, and
proportional, each shared page counted once), and the BLEU of its
answers on the test set (4 clients of ten sentences over the whole set, sacrebleu against
``-ref``). Reported: each measure's median over the rounds and the median of the rounds'
ratios (onmt_lite / LibreTranslate).
"""
import asyncio
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import sacrebleu

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
import make_libretranslate  # noqa: E402  (the reference script: how LibreTranslate is started)


def start_libretranslate(venv: str, packages: str, port: int, work: str):
    """LibreTranslate as tests/reference/make_libretranslate.py starts it (offline, inter 2 x
    intra 1, each package linked twice: with one package its start-up goes online)."""
    return make_libretranslate.start_server(
        venv, make_libretranslate.linked_twice(packages, tempfile.mkdtemp(dir=work)), port)


def start_onmt_lite(packages: str, port: int, options: str = ""):
    """``onmt_lite serve -argos_packages packages`` with ``options`` (-serve_options)."""
    from serve_bench import wait_ready
    process = subprocess.Popen(
        [sys.executable, "-m", "onmt_lite", "serve", "-argos_packages", packages, "-port",
         str(port), *shlex.split(options)], cwd=ROOT, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    wait_ready(process, port, "/ready")
    return process


class PeakMemory:
    """The largest memory of a process tree, sampled in a thread: its resident memory summed
    over the processes every 50 ms (pages shared by several processes, the torch library and
    the lanes' mapped weights, count once in each), and its proportional set size every
    PSS_SECONDS (each shared page divided among its sharers: what the tree holds).
    smaps_rollup walks every page table, too slow to read every 50 ms."""
    PSS_SECONDS = 1.0

    def __init__(self, pid: int):
        self.pid, self.peak, self.peak_pss, self.running = pid, 0.0, 0.0, True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self):
        from serve_bench import rss_mib
        last_pss = 0.0
        while self.running:
            try:
                self.peak = max(self.peak, rss_mib(self.pid))
                if time.monotonic() - last_pss >= self.PSS_SECONDS:
                    last_pss = time.monotonic()
                    self.peak_pss = max(self.peak_pss, pss_mib(self.pid))
            except (OSError, AttributeError):
                pass
            time.sleep(0.05)

    def stop(self) -> tuple:
        """(peak resident MiB, peak proportional MiB)."""
        self.running = False
        self.thread.join()
        return self.peak, self.peak_pss


def pss_mib(pid: int) -> float:
    """The proportional set size of process ``pid`` and its children, MiB."""
    from serve_bench import children
    with open(f"/proc/{pid}/smaps_rollup") as f:
        total = int(re.search(r"^Pss:\s+(\d+)", f.read(), re.M).group(1)) / 1024
    return total + sum(pss_mib(child) for child in children(pid))


async def answers(port: int, lines, clients: int = 4, per_request: int = 10):
    """Every line's translation, ``clients`` closed loops of ``per_request`` lines."""
    from serve_bench import Connection
    chunks = list(enumerate(lines[i:i + per_request] for i in range(0, len(lines), per_request)))
    found = [None] * len(chunks)

    async def client():
        connection = Connection(port)
        try:
            while chunks:
                number, chunk = chunks.pop()
                status, body = await connection.post("/translate", {
                    "q": chunk, "source": "en", "target": "de"})
                if status != 200:
                    raise RuntimeError(f"status {status}: {body}")
                found[number] = body["translatedText"]
        finally:
            connection.close()
    await asyncio.gather(*(client() for _ in range(clients)))
    return [line for chunk in found for line in chunk]


def one_server(start, args, lines, references, compiled: bool = False) -> dict:
    """One server's round; ``compiled``: after the warm-up (which loads the model), wait
    until its programs are in place, if it compiles any."""
    from serve_bench import closed_loop, free_port, wait_compiled
    port = free_port()
    process = start(port)
    memory = PeakMemory(process.pid)
    try:
        asyncio.run(closed_loop(port, "libre", 32, 1, lines, 128))  # warm-up
        if compiled:
            wait_compiled(port)
        rate_32, _ = asyncio.run(closed_loop(port, "libre", 32, 1, lines, args.sentences))
        rate_4x10, _ = asyncio.run(closed_loop(port, "libre", 4, 10, lines, args.sentences))
        _, latencies = asyncio.run(closed_loop(port, "libre", 1, 1, lines,
                                               args.latency_requests))
        bleu = sacrebleu.corpus_bleu(asyncio.run(answers(port, lines)), [references]).score
    finally:
        peak, peak_pss = memory.stop()
        process.terminate()
        process.wait()
    return {"32x1_sent_s": rate_32, "4x10_sent_s": rate_4x10,
            "1x1_median_ms": 1000 * statistics.median(latencies), "peak_rss_mib": peak,
            "peak_pss_mib": peak_pss, "bleu": bleu}


def libretranslate_rounds(args, lines, work: str) -> dict:
    """-libretranslate: both servers round by round (see the module's text)."""
    with open(args.ref, encoding="utf-8") as f:
        references = [line.rstrip("\n") for line in f][:len(lines)]
    starts = {"LibreTranslate": lambda port: start_libretranslate(
                  args.libretranslate, args.argos_packages, port, work),
              "onmt_lite": lambda port: start_onmt_lite(args.argos_packages, port,
                                                        args.serve_options)}
    rounds = []
    for r in range(args.rounds):
        names = list(starts) if r % 2 == 0 else list(starts)[::-1]
        measured = {name: one_server(starts[name], args, lines, references,
                                     name == "onmt_lite") for name in names}
        rounds.append(measured)
        print(f"round {r + 1}: " + "; ".join(
            f"{name} " + ", ".join(f"{k} {v:.1f}" for k, v in m.items())
            for name, m in measured.items()), file=sys.stderr)
    keys = list(rounds[0]["onmt_lite"])
    result = {"rounds": rounds, "packages": os.path.abspath(args.argos_packages),
              "median": {name: {k: statistics.median(r[name][k] for r in rounds) for k in keys}
                         for name in starts},
              "median_ratio": {k: statistics.median(r["onmt_lite"][k] / r["LibreTranslate"][k]
                                                    for r in rounds) for k in keys}}
    print(f"{'measure':<16}{'onmt_lite':>12}{'LibreTranslate':>16}{'ratio':>8}")
    for k in keys:
        print(f"{k:<16}{result['median']['onmt_lite'][k]:>12.1f}"
              f"{result['median']['LibreTranslate'][k]:>16.1f}{result['median_ratio'][k]:>8.2f}")
    return result


def first_answers(packages: str, runs: int, options: str = "") -> dict:
    """-first_answer N: the seconds from launching ``onmt_lite serve -argos_packages DIR`` (and
    ``options``, -serve_options) to its readiness (GET /ready answers 200; the packages' models
    load at their first request) and to its first answer of /translate (one sentence), N
    launches; median, min, max of each."""
    from serve_bench import free_port
    body = json.dumps({"q": "A dog runs.", "source": "en", "target": "de"}).encode()
    times, readies = [], []
    for _ in range(runs):
        port, start = free_port(), time.perf_counter()
        process = subprocess.Popen(
            [sys.executable, "-m", "onmt_lite", "serve", "-argos_packages", packages, "-port",
             str(port), *shlex.split(options)], cwd=ROOT, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        try:
            for request in (urllib.request.Request(f"http://127.0.0.1:{port}/ready"),
                            urllib.request.Request(f"http://127.0.0.1:{port}/translate", body,
                                                   {"Content-Type": "application/json"})):
                while process.poll() is None:
                    try:
                        with urllib.request.urlopen(request, timeout=60) as answer:
                            if answer.status == 200:
                                break
                    except OSError:  # not listening yet, or 503 while the model loads
                        time.sleep(0.02)
                else:
                    raise RuntimeError(f"the server exited ({process.returncode})")
                (readies if request.data is None else times).append(time.perf_counter() - start)
        finally:
            process.terminate()
            process.wait()
    result = {"runs": runs, "median_s": statistics.median(times), "min_s": min(times),
              "max_s": max(times), "ready_median_s": statistics.median(readies),
              "ready_min_s": min(readies), "ready_max_s": max(readies)}
    print(f"ready{' with ' + options if options else ''}: {result['ready_median_s']:.2f} s "
          f"({result['ready_min_s']:.2f}-{result['ready_max_s']:.2f}); first answer: "
          f"{result['median_s']:.2f} s ({result['min_s']:.2f}-{result['max_s']:.2f}), "
          f"{runs} launches")
    return result
