"""Many language pairs on one server: memory, a cold model's first answer and throughput with
requests spread over ten models, for the server's shared lanes and, beside it, a checkout of
the server before them (a lane set per model).

    python benchmarks/serve_many.py -package ~/argos-pkgs/fp32/translate-en_de-1_0 \\
        -before /tmp/onmt_before -json many.json

Ten Argos Translate packages are made from one (its files linked, metadata.json naming ten
language pairs en->xx: a memory and speed benchmark, every pair the same model). Each server
serves the folder (-argos_packages) with 2 lanes; then:
- each model's first request, in turn (the model loads at it): its latency;
- ``-clients`` clients send one-sentence requests spread over the ten models for ``-seconds``:
  sentences per second;
- all along, the resident memory (RSS) and proportional share (PSS) of the server's process
  tree, sampled every 0.2 s: their peaks; and each lane's RSS, PSS and USS (its pages of its
  own) from /proc/PID/smaps_rollup at the end.
The shared lanes run twice, with 2 lanes and with 1 (what a lane adds); ``-before`` names a
checkout of the server before the shared lanes (git worktree add DIR <commit>), run with the
same Python. Figures are printed, and written as JSON with ``-json``.
"""
import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGETS = ["de", "fr", "es", "it", "pt", "nl", "pl", "ru", "sv", "da"]


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines()
                    if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return "unknown CPU"


def make_packages(package: str, folder: str) -> None:
    """Ten packages en->TARGETS in ``folder``: ``package``'s files linked, metadata.json
    rewritten."""
    with open(os.path.join(package, "metadata.json"), encoding="utf-8") as f:
        metadata = json.load(f)
    for target in TARGETS:
        into = os.path.join(folder, f"translate-en_{target}-1_0")
        os.mkdir(into)
        for name in os.listdir(package):
            if name != "metadata.json":
                os.symlink(os.path.join(os.path.abspath(package), name), os.path.join(into, name))
        with open(os.path.join(into, "metadata.json"), "w", encoding="utf-8") as f:
            json.dump(dict(metadata, from_code="en", to_code=target), f)


# -- memory ---------------------------------------------------------------------------------------
def tree(pid: int) -> list:
    """``pid`` and its descendants."""
    found = [pid]
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                for child in f.read().split():
                    found += tree(int(child))
    except OSError:
        pass
    return found


def is_lane(pid: int) -> bool:
    """Whether ``pid`` is a lane (a process multiprocessing spawned, not its resource
    tracker)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read()
    except OSError:
        return False
    return b"spawn_main" in command and b"resource_tracker" not in command


def rollup(pid: int) -> dict:
    """RSS, PSS and USS (private pages) of a process, in MiB."""
    values = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[1].isdigit():
                    values[parts[0].rstrip(":")] = int(parts[1]) / 1024
    except OSError:
        return {"rss": 0.0, "pss": 0.0, "uss": 0.0}
    return {"rss": values.get("Rss", 0.0), "pss": values.get("Pss", 0.0),
            "uss": values.get("Private_Clean", 0.0) + values.get("Private_Dirty", 0.0)}


class Sampler(threading.Thread):
    """The peak RSS and PSS of a process tree, every 0.2 s."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak_rss, self.peak_pss, self.done = pid, 0.0, 0.0, threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            figures = [rollup(pid) for pid in tree(self.pid)]
            self.peak_rss = max(self.peak_rss, sum(f["rss"] for f in figures))
            self.peak_pss = max(self.peak_pss, sum(f["pss"] for f in figures))
            self.done.wait(0.2)


# -- the server -----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 5) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        return answer.read()


def translate(port: int, target: str, text: str) -> str:
    body = json.dumps({"q": text, "source": "en", "target": target}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/translate", body,
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as answer:
        return json.loads(answer.read())["translatedText"]


def start(tree_root: str, packages: str, lanes: int, port: int) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-m", "onmt_lite", "serve", "-argos_packages",
                                packages, "-lanes", str(lanes), "-port", str(port)],
                               cwd=tree_root, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server in {tree_root} exited ({process.returncode})")
        try:
            get(f"http://127.0.0.1:{port}/health", 1)
            return process
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("the server did not start")


def load(port: int, lines: list, clients: int, seconds: float, targets: list) -> tuple:
    """(sentences per second, answers) of ``clients`` closed-loop clients sending one sentence
    at a time to random models (of ``targets``) for ``seconds``."""
    count, answers, lock = [0], {}, threading.Lock()
    end = time.monotonic() + seconds

    def client(seed: int) -> None:
        rng = random.Random(seed)
        while time.monotonic() < end:
            line, target = rng.choice(lines), rng.choice(targets)
            text = translate(port, target, line)
            with lock:
                count[0] += 1
                answers.setdefault(line, set()).add(text)
    start_time = time.monotonic()
    threads = [threading.Thread(target=client, args=(seed,)) for seed in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return count[0] / (time.monotonic() - start_time), answers


def run(name: str, tree_root: str, packages: str, lanes: int, lines: list, args) -> dict:
    port = free_port()
    process = start(tree_root, packages, lanes, port)
    sampler = Sampler(process.pid)
    sampler.start()
    try:
        cold = []
        for target in TARGETS:  # each model loads at its first request
            began = time.monotonic()
            translate(port, target, lines[0])
            cold.append(time.monotonic() - began)
        rate, answers = load(port, lines, args.clients, args.seconds, TARGETS[:args.spread])
        kids = [pid for pid in tree(process.pid) if pid != process.pid and is_lane(pid)]
        per_lane = [rollup(pid) for pid in kids]
        server = rollup(process.pid)
    finally:
        sampler.done.set()
        sampler.join()
        process.terminate()
        process.wait(60)
    row = {"server": name, "lanes": lanes, "lane_processes": len(per_lane),
           "peak_rss_mib": round(sampler.peak_rss), "peak_pss_mib": round(sampler.peak_pss),
           "first_model_s": round(cold[0], 3),
           "cold_model_median_s": round(sorted(cold[1:])[len(cold[1:]) // 2], 3),
           "cold_model_max_s": round(max(cold[1:]), 3),
           "sentences_per_s": round(rate, 1),
           "server_process": {k: round(v) for k, v in server.items()},
           "lane_mean": {k: round(sum(f[k] for f in per_lane) / max(1, len(per_lane)))
                         for k in ("rss", "pss", "uss")},
           "same_answers": all(len(texts) == 1 for texts in answers.values())}
    print(f"{name}: {json.dumps(row)}", file=sys.stderr)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-package", default=os.path.expanduser(
        "~/argos-pkgs/fp32/translate-en_de-1_0"), help="an Argos Translate package folder")
    parser.add_argument("-before", help="a checkout of the server before the shared lanes")
    parser.add_argument("-clients", type=int, default=16)
    parser.add_argument("-seconds", type=float, default=30.0)
    parser.add_argument("-spread", type=int, default=len(TARGETS),
                        help="the models the clients' requests go to (the first N)")
    parser.add_argument("-lanes", default="2,1", help="the shared lanes' runs, by -lanes")
    parser.add_argument("-json", help="write the figures here")
    args = parser.parse_args()
    with open(os.path.join(ROOT, "data", "demo.en"), encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    rows = []
    with tempfile.TemporaryDirectory(prefix="serve-many-") as packages:
        make_packages(args.package, packages)
        if args.before:
            rows.append(run("before (lanes per model)", args.before, packages, 2, lines, args))
        for lanes in args.lanes.split(","):
            rows.append(run("shared lanes", ROOT, packages, int(lanes), lines, args))
    report = {"cpu": cpu_name(), "cores": os.cpu_count(), "models": len(TARGETS),
              "clients": args.clients, "seconds": args.seconds, "spread": args.spread,
              "rows": rows}
    print(f"CPU: {report['cpu']} ({report['cores']} cores); {len(TARGETS)} models, "
          f"{args.clients} clients of one sentence to {args.spread} of them for "
          f"{args.seconds:g} s")
    print(f"{'server':26} {'lanes':>5} {'procs':>5} {'peak RSS':>9} {'peak PSS':>9} "
          f"{'1st model s':>11} {'cold p50 s':>10} {'cold max s':>10} {'sent/s':>7} "
          f"{'lane RSS/PSS/USS MiB':>21}")
    for r in rows:
        lane = r["lane_mean"]
        print(f"{r['server']:26} {r['lanes']:5} {r['lane_processes']:5} "
              f"{r['peak_rss_mib']:9,} {r['peak_pss_mib']:9,} {r['first_model_s']:11.2f} "
              f"{r['cold_model_median_s']:10.2f} {r['cold_model_max_s']:10.2f} "
              f"{r['sentences_per_s']:7.1f} {lane['rss']:>7}/{lane['pss']}/{lane['uss']}")
    print(json.dumps(report))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
