"""The server under mixed load while its lanes are killed: no good request lost or wrong, memory
flat.

    python benchmarks/serve_soak.py -minutes 10 -json soak.json

``onmt_lite serve`` (the shipped model, ``-max_length_ratio 0`` so that no rule depends on a
sentence's batch-mates) takes, from ``-clients`` threads for ``-minutes``: single sentences,
lists of 2 to 6 (OpenNMT-py's API: each answered as the translator's own line), bad requests
(not JSON, no q, a text over -max_chars, a form with invalid UTF-8: each must get its 400), and
clients that send a long request and go before the answer
(their sentences must be dropped, not decoded). A lane is SIGKILLed every ``-kill_every``
seconds (a random interval between the two). Every answer to a good request is compared with
the translator's own line; the server's resident memory (its own process, and with its lanes) is
sampled every few seconds. Reported: requests of each kind and how they were answered, the
lanes killed and restarted, memory at the start and end of the run and its peak, the CPU.
The sentences are the Multi30k test set's (``../shared``), or the demo's when it is absent.
"""
import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from defaults_bench import cpu  # noqa: E402  (a sibling script, not a package)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "data", "multi30k_en_de_raw.pt")
TEST_SET = os.path.join(ROOT, "..", "shared", "data", "multi30k", "test_2016_flickr.en")
DEMO = os.path.join(ROOT, "data", "demo.en")
BAD = [  # (body, content type, what the answer must say)
    (b"{", "application/json", "not valid JSON"),
    (b'{"source": "en", "target": "de"}', "application/json", "missing q"),
    (json.dumps({"q": "a" * 6000, "source": "en", "target": "de"}).encode(),
     "application/json", "-max_chars"),
    (b"q=%FF%FE&source=en&target=de", "application/x-www-form-urlencoded", "UTF-8"),
]


def sentences(count: int) -> list:
    path = TEST_SET if os.path.exists(TEST_SET) else DEMO
    with open(path, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    return lines[:count]


def lanes_of(pid: int) -> list:
    """The server's lane processes (its children started by multiprocessing's spawn, not its
    resource tracker)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == pid and fields[0] != "Z" and b"spawn_main" in command \
                and b"resource_tracker" not in command:
            found.append(int(entry))
    return found


def rss_mib(pid: int) -> float:
    """A process's resident memory (0 once it has ended)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Soak:
    def __init__(self, lines: list, expected: dict, port: int, seconds: float, clients: int,
                 kill_every: tuple, seed: int):
        self.lines, self.expected, self.port = lines, expected, port
        self.url = f"http://127.0.0.1:{port}"
        self.seconds, self.clients, self.kill_every = seconds, clients, kill_every
        self.random = random.Random(seed)
        self.counts = Counter()
        self.failures = []  # (kind, what) of good requests lost or wrong, bad ones mis-answered
        self.lock = threading.Lock()
        self.end = 0.0

    def count(self, key: str, failure: str = None) -> None:
        with self.lock:
            self.counts[key] += 1
            if failure is not None and len(self.failures) < 20:
                self.failures.append(failure)

    def client(self, seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=self.url, timeout=120) as http:
            while time.monotonic() < self.end:
                kind = rng.choices(["single", "several", "bad", "gone"], [50, 25, 10, 15])[0]
                try:
                    getattr(self, kind)(http, rng)
                except httpx.HTTPError as err:
                    self.count(f"{kind} lost", f"{kind}: {type(err).__name__}: {err}")

    def single(self, http, rng) -> None:
        self.good(http, "single", [rng.choice(self.lines)])

    def several(self, http, rng) -> None:
        self.good(http, "several", rng.sample(self.lines, rng.randint(2, 6)))

    def good(self, http, kind: str, texts: list) -> None:
        """Through OpenNMT-py's API, which answers each text as the translator's own line
        (LibreTranslate's restores the source's case and final punctuation)."""
        response = http.post("/translator/translate", json=[{"src": t, "id": 0} for t in texts])
        if response.status_code != 200:
            self.count(f"{kind} lost", f"{kind}: {response.status_code} {response.text[:200]}")
            return
        got = [entry["tgt"] for entry in response.json()[0]]
        wrong = [(t, g) for t, g in zip(texts, got) if g != self.expected[t]]
        if wrong or len(got) != len(texts):
            self.count(f"{kind} wrong", f"{kind}: {wrong[:1]}")
        else:
            self.count(f"{kind} ok")

    def bad(self, http, rng) -> None:
        body, content_type, says = rng.choice(BAD)
        response = http.post("/translate", content=body, headers={"Content-Type": content_type})
        if response.status_code == 400 and says in response.text:
            self.count("bad refused")
        else:
            self.count("bad mis-answered", f"bad: {response.status_code} {response.text[:200]}")

    def gone(self, http, rng) -> None:
        """A long request from a client that leaves before its answer."""
        body = json.dumps({"q": [" ".join(rng.sample(self.lines, 4))] * 8, "source": "en",
                           "target": "de"}).encode()
        with socket.create_connection(("127.0.0.1", self.port)) as s:
            s.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                      b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            time.sleep(rng.uniform(0.05, 0.5))
        self.count("gone")

    def killer(self, server: int) -> None:
        while True:
            wait = self.random.uniform(*self.kill_every)
            if time.monotonic() + wait >= self.end - 2:
                return
            time.sleep(wait)
            lanes = lanes_of(server)
            if lanes:
                os.kill(self.random.choice(lanes), signal.SIGKILL)
                self.count("lanes killed")

    def memory(self, server: int, samples: list) -> None:
        """Samples the server's memory, and how long it takes to answer GET /health."""
        with httpx.Client(base_url=self.url, timeout=60) as http:
            while time.monotonic() < self.end:
                own = rss_mib(server)
                tree = own + sum(rss_mib(pid) for pid in lanes_of(server))
                start = time.monotonic()
                http.get("/health")
                samples.append((time.monotonic(), own, tree, time.monotonic() - start))
                time.sleep(2)

    def run(self, server: int) -> dict:
        start = time.monotonic()
        self.end = start + self.seconds
        samples = []
        threads = [threading.Thread(target=self.client, args=(i,)) for i in range(self.clients)]
        threads += [threading.Thread(target=self.killer, args=(server,)),
                    threading.Thread(target=self.memory, args=(server, samples))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return self.report(samples, start)

    def report(self, samples: list, start: float) -> dict:
        metrics = httpx.get(self.url + "/metrics", timeout=60).text
        restarts = sum(float(line.split()[-1]) for line in metrics.splitlines()
                       if line.startswith("onmt_lite_lane_restarts_total"))
        queue = [line for line in metrics.splitlines()
                 if line.startswith("onmt_lite_queue_length")]
        left = sum(float(line.split()[-1]) for line in metrics.splitlines()
                   if line.startswith("onmt_lite_requests_total") and 'status="499"' in line)
        warm = [s for s in samples if s[0] - start >= min(30, self.seconds / 4)] or samples
        return {"seconds": self.seconds, "clients": self.clients, "counts": dict(self.counts),
                "failures": self.failures, "lane_restarts": restarts,
                "dropped_as_clients_left": left,
                "queue_at_end": float(queue[0].split()[-1]) if queue else None,
                "server_rss_mib": {"warm": round(warm[0][1], 1), "end": round(warm[-1][1], 1),
                                   "peak": round(max(s[1] for s in warm), 1)},
                "tree_rss_mib": {"warm": round(warm[0][2], 1), "end": round(warm[-1][2], 1),
                                 "peak": round(max(s[2] for s in warm), 1)},
                "health_ms_max": round(1000 * max(s[3] for s in samples), 1)}


def soak(seconds: float, clients: int = 8, kill_every=(30.0, 60.0), lines: int = 200,
         seed: int = 1) -> dict:
    """Runs a server and the soak for ``seconds``; the report (see the module docstring)."""
    from onmt_lite.translate.build import build_translator
    texts = sentences(lines)
    translator = build_translator({"model": MODEL, "max_length_ratio": 0})
    expected = {t: r.output_lines()[0] for t, r in zip(texts, translator.translate(texts))}
    port = free_port()
    log = tempfile.TemporaryFile("w+")  # a pipe nobody reads would fill and stall the server
    server = subprocess.Popen(
        [sys.executable, "-m", "onmt_lite", "serve", "-model", MODEL, "-src_lang", "en",
         "-tgt_lang", "de", "-port", str(port), "-max_length_ratio", "0"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            if server.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"the server ended: {log.read()[-2000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/ready").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not start in 120 s")
            time.sleep(0.1)
        report = Soak(texts, expected, port, seconds, clients, kill_every, seed).run(server.pid)
        after = httpx.post(f"http://127.0.0.1:{port}/translator/translate", timeout=60,
                           json=[{"src": texts[0], "id": 0}])
        report["serves_after"] = after.status_code == 200 and \
            after.json()[0][0]["tgt"] == expected[texts[0]]
        return report
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-minutes", type=float, default=10.0)
    parser.add_argument("-clients", type=int, default=8)
    parser.add_argument("-kill_every", type=float, nargs=2, default=(30.0, 60.0),
                        metavar=("MIN", "MAX"), help="seconds between lane kills")
    parser.add_argument("-seed", type=int, default=1)
    parser.add_argument("-json", help="also write the report here")
    args = parser.parse_args()
    report = soak(args.minutes * 60, args.clients, tuple(args.kill_every), seed=args.seed)
    report["cpu"] = cpu()["model"]
    counts = report["counts"]
    good = sum(v for k, v in counts.items() if k.startswith(("single", "several")))
    lost = sum(v for k, v in counts.items() if k.endswith(("lost", "wrong")))
    print(f"CPU: {report['cpu']}; {args.minutes:g} min, {args.clients} clients")
    print(f"good requests: {good}, lost or wrong: {lost}; bad requests refused: "
          f"{counts.get('bad refused', 0)}, mis-answered: {counts.get('bad mis-answered', 0)}; "
          f"clients gone: {counts.get('gone', 0)}")
    print(f"requests dropped as their client left: {report['dropped_as_clients_left']:g}")
    print(f"lanes killed: {counts.get('lanes killed', 0)}, restarted: "
          f"{report['lane_restarts']:g}; queue at the end: {report['queue_at_end']:g}; serves "
          f"after: {report['serves_after']}")
    for what in ("server_rss_mib", "tree_rss_mib"):
        m = report[what]
        print(f"{what}: warm {m['warm']}, end {m['end']}, peak {m['peak']}")
    print(f"GET /health answered in {report['health_ms_max']} ms at most")
    for failure in report["failures"]:
        print("  ", failure)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
