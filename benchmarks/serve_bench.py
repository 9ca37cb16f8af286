"""The translation server under load, against the command line and OpenNMT-py's server.

    python benchmarks/serve_bench.py -peers ~/onmt-peers -json serve.json

One checkpoint (the OpenNMT-py Transformer fixture, which all three tools load) and the
sentences of the test set. Clients are closed loops (send a request, wait for its answer, send
the next) over keep-alive connections, written on asyncio streams so that the client costs the
2-core machine as little as possible; every tool is measured by the same client. Reported per
setting (clients x sentences per request): sentences per second, the p50 / p99 latency of a
request, the CPU time the server's own process and the client take per request and the lanes per
sentence. Beside them: translate.py's batch throughput on the same sentences (its translation
time, start-up excluded), and OpenNMT-py's server (``onmt_server``, peers virtualenv) with the
same checkpoint and beam. The mixed load sends one-sentence requests from one client while
``-mixed_clients`` clients send ten long sentences each (``-mixed_requests`` short requests, the
50 shortest sentences in turn), and compares the short requests' p99
with their p99 on the idle server. ``-memory_requests N`` sends N one-sentence requests and
samples the server's resident memory as they go. The JSON names the CPU.

``-headline N`` measures only the targets' setting, 32 clients of one sentence, against
translate.py and OpenNMT-py's server, in turn in each of N rounds (their order rotating): this
machine's speed drifts over minutes, so each ratio is taken within a round, and the medians of
the rounds' ratios are reported. Beside them, the setting's ceiling on this machine (see
headline()): translate.py's rate with batches of 16 over its default rate, times the share of
the CPU time the HTTP side leaves the lanes.

``-libretranslate VENV -argos_packages DIR -rounds N`` measures onmt_lite's server against
LibreTranslate on the same Argos package (libre_bench.py); ``-first_answer N -argos_packages DIR``
times N launches of the server to their first answer.

``-compare DIR -rounds N`` measures only the closed-loop settings, against a server started from
another checkout of onmt_lite (an older commit: ``git worktree add DIR REV``), the two started
in turn for each of N rounds, the first of each round alternating; reported per setting: each
one's median and the median of the rounds' ratios (this tree / DIR).
"""
import argparse
import asyncio
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from defaults_bench import cpu  # noqa: E402  (a sibling script, not a package)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(ROOT, "..", "shared")


# -- a lean HTTP/1.1 client -------------------------------------------------------------------
class Connection:
    def __init__(self, port: int):
        self.port = port
        self.reader = self.writer = None

    async def post(self, path: str, payload) -> tuple:
        """(status, parsed JSON body) of a POST on a kept-alive connection."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        body = json.dumps(payload).encode()
        self.writer.write(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                          f"application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                          + body)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
        data = await self.reader.readexactly(length)
        if re.search(rb"(?i)connection: *close", head):
            self.writer.close()
            self.reader = self.writer = None
        return status, json.loads(data)

    def close(self):
        if self.writer is not None:
            self.writer.close()


def request_body(api: str, sentences):
    if api == "onmt":
        return "/translator/translate", [{"src": s, "id": 0} for s in sentences]
    return "/translate", {"q": list(sentences), "source": "en", "target": "de"}


async def closed_loop(port: int, api: str, clients: int, per_request: int, lines, total: int):
    """``clients`` clients each sending requests of ``per_request`` lines until ``total``
    sentences are answered; (sentences per second, request latencies)."""
    queue = [lines[i % len(lines):i % len(lines) + per_request]
             for i in range(0, total, per_request)]
    queue = [q if len(q) == per_request else lines[:per_request] for q in queue]
    latencies, errors = [], []

    async def client():
        connection = Connection(port)
        try:
            while queue:
                sentences = queue.pop()
                path, payload = request_body(api, sentences)
                start = time.perf_counter()
                status, _ = await connection.post(path, payload)
                latencies.append(time.perf_counter() - start)
                if status != 200:
                    errors.append(status)
        finally:
            connection.close()
    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed: {errors[:5]}")
    return len(latencies) * per_request / elapsed, latencies


async def mixed(port: int, api: str, long_clients: int, long_lines, short_lines, total: int):
    """``total`` short one-sentence requests, one at a time, while ``long_clients`` clients
    keep ten-line requests of long sentences going; the short requests' latencies."""
    stop = False

    async def long_client():
        connection = Connection(port)
        try:
            while not stop:
                await connection.post(*request_body(api, long_lines[:10]))
        finally:
            connection.close()
    runners = [asyncio.create_task(long_client()) for _ in range(long_clients)]
    await asyncio.sleep(1.0)  # the long requests are decoding
    _, latencies = await closed_loop(port, api, 1, 1, short_lines, total)
    stop = True
    await asyncio.gather(*runners)
    return latencies


def percentile(values, q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


# -- the servers --------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(process, port: int, path: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with status {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                if b" 200 " in s.recv(100):
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the server did not start")


def wait_compiled(port: int, timeout: float = 900) -> None:
    """Waits until every model of the server that compiles (-compile, or stored in int8)
    decodes through its compiled programs (/metrics: onmt_lite_model_compiled), built beside
    it after it loaded: figures are taken from then on, not while it still answers
    uncompiled. Returns at once where no model compiles."""
    import urllib.request
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            states = re.findall(r'^onmt_lite_model_compiled\{[^}]*\} (\S+)$',
                                answer.read().decode(), re.M)
        if all(float(state) == 1 for state in states):
            return
        time.sleep(0.2)
    raise RuntimeError(f"the server's programs were not in place after {timeout:.0f} s")


def start_onmt_lite(args, port: int, root: str = ROOT):
    cmd = [sys.executable, "-m", "onmt_lite", "serve", "-model", args.model, "-src_lang", "en",
           "-tgt_lang", "de", "-port", str(port), "-beam_size", str(args.beam_size),
           "-max_queue", "100000",  # 128 clients x 10 sentences is more than the default queue
           *args.decoding.split(), *args.serve_options.split()]
    process = subprocess.Popen(cmd, cwd=root, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    wait_ready(process, port, "/ready")
    if "-compile" in args.decoding.split() + args.serve_options.split():
        wait_compiled(port)
    return process


def start_onmt_py(args, port: int, work: str):
    conf = os.path.join(work, "conf.json")
    with open(conf, "w") as f:
        json.dump({"models_root": os.path.dirname(os.path.abspath(args.model)), "models": [
            {"id": 0, "model": os.path.basename(args.model), "load": True,
             "opt": {"beam_size": args.beam_size}}]}, f)
    env = dict(os.environ, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1")
    process = subprocess.Popen([os.path.join(args.peers, "bin", "onmt_server"), "--ip",
                                "127.0.0.1", "--port", str(port), "--model_config", conf],
                               cwd=work, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    wait_ready(process, port, "/translator/health")
    return process


def rss_mib(pid: int) -> float:
    """The resident memory of process ``pid`` and its children (the server and its lanes)."""
    with open(f"/proc/{pid}/status") as f:
        total = int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)) / 1024
    return total + sum(rss_mib(child) for child in children(pid))


def command_line_rate(args, lines, work: str, *options: str) -> float:
    src, out = os.path.join(work, "src.txt"), os.path.join(work, "out.txt")
    with open(src, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "translate.py"), "-model",
                           args.model, "-src", src, "-output", out, "-beam_size",
                           str(args.beam_size), "-report_time", "-no_progress",
                           *args.decoding.split(), *options],
                          capture_output=True, text=True, check=True)
    seconds = float(re.search(r"Total translation time \(s\): ([\d.]+)", proc.stderr).group(1))
    return len(lines) / seconds


def children(pid: int) -> list:
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):  # a child belongs to the thread that made it
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found += [int(child) for child in f.read().split()]
    return found


def cpu_seconds(pid: int) -> float:
    """The CPU time (user + system) process ``pid`` has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def closed_loop_cpu(process, port: int, api: str, clients: int, per_request: int, lines,
                    total: int) -> tuple:
    """closed_loop's (rate, latencies), and the CPU seconds it took: the server's own process
    (HTTP, JSON, queues; for OpenNMT-py, decoding too), its children (the lanes), the client."""
    pids = [process.pid] + children(process.pid)
    before, client = [cpu_seconds(pid) for pid in pids], time.process_time()
    rate, latencies = asyncio.run(closed_loop(port, api, clients, per_request, lines, total))
    client = time.process_time() - client
    used = [cpu_seconds(pid) - b for pid, b in zip(pids, before)]
    return rate, latencies, used[0], sum(used[1:]), client


def measure_server(args, name: str, process, port: int, api: str, lines, settings) -> list:
    """Each setting's rate and latencies, and the CPU time taken by the server's own process
    (HTTP, JSON, queues; for OpenNMT-py, decoding too) and by its children (the lanes)."""
    rows = []
    for clients, per_request in settings:
        total = args.sentences if name == "onmt_lite" else args.peer_sentences
        total = max(total, clients * per_request)
        rate, latencies, server, lanes, client = closed_loop_cpu(
            process, port, api, clients, per_request, lines, total)
        row = {"server": name, "clients": clients, "sentences_per_request": per_request,
               "sentences": len(latencies) * per_request, "sentences_per_s": rate,
               "p50_ms": 1000 * percentile(latencies, 0.5),
               "p99_ms": 1000 * percentile(latencies, 0.99),
               "server_cpu_ms_per_request": 1000 * server / len(latencies),
               "client_cpu_ms_per_request": 1000 * client / len(latencies),
               "lanes_cpu_ms_per_sentence": 1000 * lanes / (len(latencies) * per_request)}
        rows.append(row)
        print(f"{name:10} {clients:4} clients x {per_request:2} sentences: {rate:7.1f} sent/s, "
              f"p50 {row['p50_ms']:7.1f} ms, p99 {row['p99_ms']:7.1f} ms, CPU: server "
              f"{row['server_cpu_ms_per_request']:.2f} ms/request, client "
              f"{row['client_cpu_ms_per_request']:.2f} ms/request, lanes "
              f"{row['lanes_cpu_ms_per_sentence']:.2f} ms/sentence", file=sys.stderr)
    return rows


def server_rate(start, args, port: int, api: str, lines, total: int, clients: int = 32,
                per_request: int = 1) -> tuple:
    """(sentences per second, the HTTP side's share of the CPU time) of ``clients`` clients of
    ``per_request`` sentences, on a server ``start`` starts (after a warm-up). The HTTP side:
    the server's own process and the client, against them and the server's children (the
    lanes; OpenNMT-py's server has none: it decodes in its own process)."""
    process = start(args, port)
    try:
        asyncio.run(closed_loop(port, api, clients, per_request, lines,
                                max(64, clients * per_request)))
        rate, _, server, lanes, client = closed_loop_cpu(process, port, api, clients,
                                                         per_request, lines, total)
        return rate, (server + client) / max(server + lanes + client, 1e-9)
    finally:
        process.terminate()
        process.wait()


def headline(args, lines, work: str) -> dict:
    """The targets' setting, round by round (see above), and its ceiling on this machine:
    32 one-sentence clients keep at most 16 sentences a lane in flight, so the lanes decode
    at best as translate.py's two processes decode sorted batches of 16 (``-batch_size 16``),
    on the CPU time the HTTP side leaves them."""
    measures = {  # each gives (sentences per second, the HTTP side's CPU share or None)
        "translate.py": lambda: (command_line_rate(args, lines, work), None),
        "translate.py -batch_size 16": lambda: (command_line_rate(
            args, lines, work, "-batch_size", "16"), None),
        "onmt_lite": lambda: server_rate(start_onmt_lite, args, free_port(), "libre", lines,
                                         args.sentences),
        "OpenNMT-py": lambda: server_rate(lambda a, port: start_onmt_py(a, port, work), args,
                                          free_port(), "onmt", lines, args.peer_sentences)}
    names, rounds = list(measures), []
    for r in range(args.headline):
        order = names[r % len(names):] + names[:r % len(names)]
        measured = {name: measures[name]() for name in order}
        rates = {name: rate for name, (rate, _) in measured.items()}
        share = rates["http_share"] = measured["onmt_lite"][1]
        rates["ceiling"] = rates["translate.py -batch_size 16"] / rates["translate.py"] * (
            1 - share)
        rounds.append(rates)
        print(f"round {r + 1}: " + ", ".join(f"{n} {rates[n]:.1f}" for n in names) +
              f" sent/s; onmt_lite {rates['onmt_lite'] / rates['translate.py']:.2f} of "
              f"translate.py, {rates['onmt_lite'] / rates['OpenNMT-py']:.1f}x OpenNMT-py; "
              f"ceiling {rates['ceiling']:.2f} (HTTP side {share:.0%} of the CPU)",
              file=sys.stderr)
    result = {"rounds": rounds, "median_vs_translate": statistics.median(
        r["onmt_lite"] / r["translate.py"] for r in rounds), "median_vs_onmt_py":
        statistics.median(r["onmt_lite"] / r["OpenNMT-py"] for r in rounds),
        "median_ceiling": statistics.median(r["ceiling"] for r in rounds)}
    result.update({f"median_{n}": statistics.median(r[n] for r in rounds) for n in names})
    print(f"32 clients of one sentence, {args.headline} rounds: onmt_lite "
          f"{result['median_vs_translate']:.2f} of translate.py's rate, "
          f"{result['median_vs_onmt_py']:.1f}x OpenNMT-py's server (medians of the rounds' "
          f"ratios; rates: " + ", ".join(f"{n} {result['median_' + n]:.1f}" for n in names)
          + f" sent/s); ceiling {result['median_ceiling']:.2f} of translate.py's rate")
    return result


def compare(args, lines, settings) -> list:
    """Each setting's rate for this tree and ``args.compare``, round by round (see above)."""
    roots, rows = {"this": ROOT, "other": os.path.abspath(args.compare)}, []
    for clients, per_request in settings:
        rates = {name: [] for name in roots}
        for r in range(args.rounds):
            for name in (list(roots) if r % 2 == 0 else list(roots)[::-1]):
                rates[name].append(server_rate(
                    lambda a, port, root=roots[name]: start_onmt_lite(a, port, root), args,
                    free_port(), "libre", lines, args.sentences, clients, per_request)[0])
        ratio = statistics.median(a / b for a, b in zip(rates["this"], rates["other"]))
        rows.append({"clients": clients, "sentences_per_request": per_request, "rates": rates,
                     "median_ratio": ratio})
        print(f"{clients:4} clients x {per_request:2} sentences: this tree "
              f"{statistics.median(rates['this']):7.1f} sent/s, {args.compare} "
              f"{statistics.median(rates['other']):7.1f}, round by round {ratio:.3f} "
              f"({args.rounds} rounds)")
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-model", default=os.path.join(SHARED, "fixtures", "onmt-py",
                                                  "transformer.pt"))
    p.add_argument("-src", default=os.path.join(SHARED, "data", "multi30k",
                                                "test_2016_flickr.lc.tok.en"))
    p.add_argument("-peers", help="virtualenv with OpenNMT-py (../shared/peers/setup-peers.sh)")
    p.add_argument("-beam_size", type=int, default=5)
    p.add_argument("-clients", type=int, nargs="+", default=[1, 8, 32, 128])
    p.add_argument("-per_request", type=int, nargs="+", default=[1, 10])
    p.add_argument("-sentences", type=int, default=1000, help="per setting, onmt_lite")
    p.add_argument("-peer_sentences", type=int, default=200, help="per setting, OpenNMT-py")
    p.add_argument("-peer_clients", type=int, nargs="+", default=[1, 16, 32])
    p.add_argument("-mixed_clients", type=int, default=4)
    p.add_argument("-mixed_requests", type=int, default=200)
    p.add_argument("-memory_requests", type=int, default=0)
    p.add_argument("-decoding", default="", help="translate.py decoding options for both the "
                   "server and translate.py (\"-compile\")")
    p.add_argument("-serve_options", default="", help="more onmt_lite serve options")
    p.add_argument("-compare", help="another checkout of onmt_lite to measure against")
    p.add_argument("-rounds", type=int, default=3, help="with -compare or -libretranslate")
    p.add_argument("-headline", type=int, default=0,
                   help="rounds of the targets' setting only (needs -peers)")
    p.add_argument("-libretranslate", metavar="VENV", help="LibreTranslate's virtualenv "
                   "(../shared/peers/setup-libretranslate.sh): measure onmt_lite's server "
                   "against it on the same Argos package, -rounds rounds (libre_bench.py)")
    p.add_argument("-argos_packages", default=os.path.expanduser("~/argos-pkgs/int8"),
                   help="with -libretranslate: the folder of Argos packages both serve")
    p.add_argument("-ref", default=os.path.join(SHARED, "data", "multi30k",
                                                "test_2016_flickr.de"),
                   help="with -libretranslate: the reference of the raw -src, for BLEU")
    p.add_argument("-latency_requests", type=int, default=100,
                   help="with -libretranslate: one client's one-sentence requests")
    p.add_argument("-first_answer", type=int, default=0, metavar="N",
                   help="instead: N launches of serve -argos_packages, each timed to its "
                        "first answer")
    p.add_argument("-json", help="also write the figures here")
    args = p.parse_args(argv)
    with open(args.src, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    results = {"cpu": cpu(), "model": os.path.basename(args.model), "beam_size": args.beam_size,
               "decoding": args.decoding, "rows": []}
    settings = [(c, n) for n in args.per_request for c in args.clients]
    if args.first_answer:
        from libre_bench import first_answers
        results["first_answer"] = first_answers(args.argos_packages, args.first_answer,
                                                args.serve_options)
        write_json(args, results)
        return
    if args.libretranslate:  # raw text: the packages read it through their sentencepiece
        from libre_bench import libretranslate_rounds
        if args.src.endswith(".lc.tok.en"):
            args.src = args.src[:-len(".lc.tok.en")] + ".en"
            with open(args.src, encoding="utf-8") as f:
                lines = [line.strip() for line in f if line.strip()]
        with tempfile.TemporaryDirectory() as work:
            results["libretranslate"] = libretranslate_rounds(args, lines, work)
        write_json(args, results)
        return
    if args.compare:
        results["compare"] = {"other": args.compare, "rows": compare(args, lines, settings)}
        write_json(args, results)
        return
    if args.headline:
        if not args.peers:
            p.error("-headline needs -peers (OpenNMT-py's server)")
        with tempfile.TemporaryDirectory() as work:
            results["headline"] = headline(args, lines, work)
        write_json(args, results)
        return
    with tempfile.TemporaryDirectory() as work:
        results["command_line_sentences_per_s"] = command_line_rate(args, lines, work)
        print(f"translate.py: {results['command_line_sentences_per_s']:.1f} sent/s",
              file=sys.stderr)
        port = free_port()
        server = start_onmt_lite(args, port)
        try:
            results["rows"] += measure_server(args, "onmt_lite", server, port, "libre", lines,
                                              settings)
            by_length = sorted(lines, key=len)
            short, long = by_length[:100:2], by_length[-10:]
            idle = asyncio.run(closed_loop(port, "libre", 1, 1, short, args.mixed_requests))[1]
            busy = asyncio.run(mixed(port, "libre", args.mixed_clients, long, short,
                                     args.mixed_requests))
            results["mixed"] = {"long_clients": args.mixed_clients,
                                "short_requests": args.mixed_requests,
                                "short_idle_p50_ms": 1000 * percentile(idle, 0.5),
                                "short_idle_p99_ms": 1000 * percentile(idle, 0.99),
                                "short_busy_p50_ms": 1000 * percentile(busy, 0.5),
                                "short_busy_p99_ms": 1000 * percentile(busy, 0.99)}
            print(f"mixed: {results['mixed']}", file=sys.stderr)
            if args.memory_requests:
                samples = [rss_mib(server.pid)]
                step = max(1, args.memory_requests // 10)
                for _ in range(0, args.memory_requests, step):
                    asyncio.run(closed_loop(port, "libre", 32, 1, lines, step))
                    samples.append(rss_mib(server.pid))
                    print(f"memory after {step * (len(samples) - 1)} requests: "
                          f"{samples[-1]:.0f} MiB", file=sys.stderr)
                results["memory_mib"] = {"requests": args.memory_requests, "samples": samples}
        finally:
            server.terminate()
            server.wait()
        if args.peers:
            port = free_port()
            peer = start_onmt_py(args, port, work)
            try:
                results["rows"] += measure_server(args, "OpenNMT-py", peer, port, "onmt", lines,
                                                  [(c, 1) for c in args.peer_clients])
            finally:
                peer.terminate()
                peer.wait()
    cli = results["command_line_sentences_per_s"]
    print(f"CPU: {results['cpu']['model']}, {results['cpu']['cores']} cores; translate.py "
          f"{cli:.1f} sentences/s")
    print(f"{'server':10} {'clients':>7} {'sent/req':>8} {'sent/s':>8} {'vs CLI':>7} "
          f"{'p50 ms':>8} {'p99 ms':>8} {'server CPU ms/req':>17} {'client CPU ms/req':>17} "
          f"{'lanes CPU ms/sent':>17}")
    for r in results["rows"]:
        print(f"{r['server']:10} {r['clients']:7} {r['sentences_per_request']:8} "
              f"{r['sentences_per_s']:8.1f} {r['sentences_per_s'] / cli:7.2f} "
              f"{r['p50_ms']:8.1f} {r['p99_ms']:8.1f} {r['server_cpu_ms_per_request']:17.2f} "
              f"{r['client_cpu_ms_per_request']:17.2f} {r['lanes_cpu_ms_per_sentence']:17.2f}")
    if "mixed" in results:
        m = results["mixed"]
        print(f"mixed load ({m['long_clients']} clients of 10 long sentences): short requests "
              f"p50 {m['short_busy_p50_ms']:.0f} ms, p99 {m['short_busy_p99_ms']:.0f} ms; idle p50 "
              f"{m['short_idle_p50_ms']:.0f} ms, p99 {m['short_idle_p99_ms']:.0f} ms")
    write_json(args, results)


def write_json(args, results: dict) -> None:
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
