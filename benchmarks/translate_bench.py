"""Translation speed, memory and BLEU: onmt_lite's engines, and optionally OpenNMT-py and
CTranslate2 on the same checkpoint, side by side in one run.

    python benchmarks/translate_bench.py -model M.pt -src SRC -ref REF [-peers VENV] [-json F]
    python benchmarks/translate_bench.py -model M.pt -src SRC -ref REF -growth
    python benchmarks/translate_bench.py -model M.pt -src SRC -ref REF -memory_lines 100000
    python benchmarks/translate_bench.py -model M.pt -src SRC -ref REF -startup
    python benchmarks/translate_bench.py -table transformer.json rnn.json   # docs/speed.md's tables

onmt_lite runs with ``-inter_threads`` batches at a time on ``-threads`` threads each (default
2 x 1), OpenNMT-py on ``-onmt_threads`` torch threads, CTranslate2 with each ``-ct2`` setting
(INTERxINTRA threads). Every configuration runs ``-warmup`` times unmeasured, then ``-runs``
times, each in its own process. Reported per configuration (median, min, max over runs):
translation time without interpreter start-up and model load (as each tool reports it),
whole-process time, sentences/s and target tokens/s (over translation time), peak RSS (of the
largest process; RSS and PSS summed over the process and its children, sampled), BLEU
(sacrebleu, -tok none) and the share of output lines identical to the first configuration's.
-growth forces output lengths of 10, 50 and 200 tokens and
reports tokens/s for each (CTranslate2 too, given -peers).
Peers come from a separate virtualenv (../shared/peers/setup-peers.sh VENV makes one); they are
never dependencies of onmt_lite.
"""
import argparse
import json
import math
import os
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import sacrebleu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.sysconf("SC_PAGE_SIZE")
CT2_SCRIPT = """
import sys, time, ctranslate2
model, src, out, beam, batch, compute, inter, intra, min_len, max_len = sys.argv[1:11]
translator = ctranslate2.Translator(model, device="cpu", compute_type=compute,
                                    inter_threads=int(inter), intra_threads=int(intra))
lines = [l.split() for l in open(src, encoding="utf-8").read().split("\\n")[:-1]]
start = time.time()
results = translator.translate_batch(lines, beam_size=int(beam), max_batch_size=int(batch),
                                     length_penalty=1.0, min_decoding_length=int(min_len),
                                     max_decoding_length=int(max_len))
elapsed = time.time() - start
with open(out, "w", encoding="utf-8") as f:
    f.write("".join(" ".join(r.hypotheses[0]) + "\\n" for r in results))
print("Total translation time (s): %.4f" % elapsed)
"""

# OpenNMT-py 3.5.1 checkpoints pickle an argparse.Namespace; "scaled-dot-flash" is the same
# attention as "scaled-dot", the only name CTranslate2's converter accepts.
CT2_CONVERT = """
import argparse, sys, tempfile, torch
from ctranslate2.converters import OpenNMTPyConverter
torch.serialization.add_safe_globals([argparse.Namespace])
ckpt = torch.load(sys.argv[1], map_location="cpu", weights_only=True)
if getattr(ckpt["opt"], "self_attn_type", None) == "scaled-dot-flash":
    ckpt["opt"].self_attn_type = "scaled-dot"
with tempfile.NamedTemporaryFile(suffix=".pt") as f:
    torch.save(ckpt, f.name)
    OpenNMTPyConverter(f.name).convert(sys.argv[2], force=True)
"""


def measure(configs, args):
    """Warm-up and timed runs of every configuration (name, cmd, output, env), each run in a
    fresh helper process. Runs go round the configurations in turn, so that a slow spell of a
    shared machine falls on all of them rather than on one."""
    runs = {name: [] for name, *_ in configs}
    for i in range(args.warmup + args.runs):
        for name, cmd, _, env in configs:
            run = run_once(cmd, env, name)
            if i >= args.warmup:
                runs[name].append(run)
    return [summarize(name, runs[name], output, args) for name, _, output, _ in configs]


def summarize(name, runs, output, args):
    """Median, min and max of the runs; sentences/s, tokens/s and BLEU of the output."""
    with open(output, encoding="utf-8") as f:
        hyps = f.read().split("\n")[:-1]
    with open(args.ref, encoding="utf-8") as f:
        refs = f.read().split("\n")[:-1]
    if len(hyps) != len(refs):
        raise ValueError(f"{name}: {len(hyps)} output lines but {len(refs)} reference lines")
    tokens = sum(len(h.split()) for h in hyps)

    def stats(key):
        values = [r[key] for r in runs]
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    t = stats("translate_s")
    return {"name": name, "translate_s": t, "translate_runs": [r["translate_s"] for r in runs],
            "process_s": stats("process_s"),
            "peak_rss_mib": stats("peak_rss_mib"), "peak_rss_sum_mib": stats("peak_rss_sum_mib"),
            "peak_pss_sum_mib": stats("peak_pss_sum_mib"),
            "sents_per_s": len(hyps) / t["median"], "tokens_per_s": tokens / t["median"],
            "bleu": round(sacrebleu.corpus_bleu(hyps, [refs], tokenize="none", force=True).score, 2)}


def tree_memory_mib(pid: int, pss: bool = False):
    """Resident memory of a process and all its descendants, summed (MiB; Linux /proc): RSS
    (pages shared by forked workers counted in each) and, with ``pss``, PSS (shared pages
    divided among their sharers: the memory the run really takes; else 0).

    RSS comes from statm (0.3 ms a sample); PSS from smaps_rollup, which walks every page
    table: 40 ms of kernel time for a process and two workers, which slowed the tool measured.
    """
    rss = pss_kib = 0
    todo = [pid]
    while todo:
        pid = todo.pop()
        try:
            if pss:
                with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
                    pss_kib += sum(int(line.split()[1]) for line in f if line.startswith("Pss:"))
            with open(f"/proc/{pid}/statm", encoding="ascii") as f:
                rss += int(f.read().split()[1]) * PAGE
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as f:
                    todo.extend(int(c) for c in f.read().split())
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return rss / 2 ** 20, pss_kib / 1024.0


def child(cmd):
    """Runs cmd and prints one JSON line: its log, wall time, peak RSS (MiB) of the largest
    process, and the peaks of the RSS (sampled every 50 ms) and PSS (at 0.25, 0.5, 1, 2, 4...
    seconds: see tree_memory_mib) summed over the process and its children."""
    start = time.time()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=os.environ.copy())
        summed = shared = 0.0
        next_pss = 0.25
        while proc.poll() is None:
            with_pss = time.time() - start >= next_pss
            rss, pss = tree_memory_mib(proc.pid, with_pss)
            summed, shared = max(summed, rss), max(shared, pss)
            if with_pss:
                next_pss *= 2
            time.sleep(0.05)
        wall = time.time() - start
        out.seek(0)
        err.seek(0)
        log = out.read() + err.read()
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0
    if proc.returncode != 0:
        sys.stderr.write(log[-3000:])
        sys.exit(proc.returncode)
    print(json.dumps({"log": log, "wall": wall, "rss": rss, "rss_sum": summed, "pss_sum": shared}))


def onmt_lite_command(args, src: str, out: str, *options: str) -> list:
    """translate.py on ``src`` with the benchmark's model, beam, batch and thread settings."""
    return [sys.executable, os.path.join(ROOT, "translate.py"), "-model", args.model, "-src", src,
            "-output", out, "-beam_size", str(args.beam_size), "-batch_size", str(args.batch_size),
            "-threads", str(args.threads), "-inter_threads", str(args.inter_threads),
            "-report_time", *options, *shlex.split(args.extra)]


def peers_env(args) -> dict:
    return dict(os.environ, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1",
                OMP_NUM_THREADS=str(args.onmt_threads))


def ct2_model(args, work) -> str:
    """The model converted for CTranslate2 (its folder), or "" where it cannot be converted."""
    ct2_dir = os.path.join(work, "ct2")
    if os.path.isdir(ct2_dir):
        return ct2_dir
    convert = subprocess.run([os.path.join(args.peers, "bin", "python"), "-c", CT2_CONVERT,
                              args.model, ct2_dir], env=peers_env(args), capture_output=True,
                             text=True)
    if convert.returncode != 0:  # e.g. RNN models, which CTranslate2 does not convert
        reason = convert.stderr.strip().splitlines()[-1]
        print(f"CTranslate2 skipped: {reason}", file=sys.stderr)
        return ""
    return ct2_dir


def ct2_command(args, ct2_dir: str, src: str, out: str, compute: str, threads: str,
                min_length: int = 0, max_length: int = 250) -> list:
    return [os.path.join(args.peers, "bin", "python"), "-c", CT2_SCRIPT, ct2_dir, src, out,
            str(args.beam_size), str(args.batch_size), compute, *threads.split("x"),
            str(min_length), str(max_length)]


def run_once(cmd, env=None, name: str = "") -> dict:
    """One run of cmd in a helper process: translation seconds (as the tool reports it, else
    the process's), process seconds and peak RSS (MiB)."""
    proc = subprocess.run([sys.executable, __file__, "-_child"] + cmd, capture_output=True,
                          text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{name or cmd[0]} failed:\n{proc.stderr[-2000:]}")
    child_result = json.loads(proc.stdout.strip().splitlines()[-1])
    match = re.search(r"Total translation time \(s\): ([\d.]+)", child_result["log"])
    return {"translate_s": float(match.group(1)) if match else child_result["wall"],
            "process_s": child_result["wall"], "peak_rss_mib": child_result["rss"],
            "peak_rss_sum_mib": child_result["rss_sum"],
            "peak_pss_sum_mib": child_result["pss_sum"]}


def growth(args, work):
    """Target tokens/s for outputs forced to ~10, ~50 and ~200 tokens (-min_length =
    -max_length): per-token cost should not grow with the output length."""
    with open(args.src, encoding="utf-8") as f:
        lines = f.read().split("\n")[:-1][:args.growth_lines]
    src = os.path.join(work, "growth.src")
    with open(src, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
    forced = ["-max_length_ratio", "0", "-min_length", "{n}", "-max_length", "{n}"]
    tools = [(name, None, lambda out, n, extra=extra: onmt_lite_command(
        args, src, out, *[o.format(n=n) for o in forced + extra]))
        for name, extra in (("onmt_lite", []), ("onmt_lite -fast", ["-fast"]))]
    ct2_dir = ct2_model(args, work) if args.peers else None
    if ct2_dir:  # the same forced lengths, with onmt_lite's thread layout
        threads = f"{args.inter_threads}x{args.threads}"
        tools.append((f"CT2 float32 {threads}", peers_env(args), lambda out, n: ct2_command(
            args, ct2_dir, src, out, "float32", threads, n, n)))
    rows = []
    for name, env, command in tools:
        for length in (10, 50, 200):
            out = os.path.join(work, f"growth.{length}.txt")
            times = [run_once(command(out, length), env, name)["translate_s"]
                     for _ in range(args.warmup + args.runs)][args.warmup:]
            with open(out, encoding="utf-8") as f:
                tokens = sum(len(line.split()) for line in f)
            median = statistics.median(times)
            rows.append({"tool": name, "output_tokens": round(tokens / len(lines), 1),
                         "translate_s": median, "tokens_per_s": tokens / median})
    print(f"{'tool':20} {'tokens/sentence':>16} {'translate s':>12} {'tok/s':>9} {'vs ~10':>7}")
    for row in rows:
        shortest = next(r for r in rows if r["tool"] == row["tool"])
        row["vs_shortest"] = row["tokens_per_s"] / shortest["tokens_per_s"]
        print(f"{row['tool']:20} {row['output_tokens']:16.1f} {row['translate_s']:12.2f} "
              f"{row['tokens_per_s']:9.1f} {row['vs_shortest']:7.2f}")
    return rows


def startup(args, work):
    """A fresh process's time to its first translation (one line, whole process): exact, -fast,
    and -compile with an empty compile cache, then with the cache the first run filled."""
    src = os.path.join(work, "startup.src")
    with open(args.src, encoding="utf-8") as f, open(src, "w", encoding="utf-8") as out:
        out.write(f.readline())
    cache = os.path.join(work, "startup-cache")
    cases = [("exact", []), ("-fast", ["-fast"]),
             ("-compile, empty compile cache", ["-compile", "-compile_cache", cache]),
             ("-compile, warm compile cache", ["-compile", "-compile_cache", cache]),
             ("-compile, no C++ compiler", ["-compile"])]
    rows = []
    for name, options in cases:
        env = dict(os.environ, CXX="/no/compiler") if "no C++" in name else None
        times = []
        for _ in range(args.runs):
            if "empty" in name:
                shutil.rmtree(cache, ignore_errors=True)
            cmd = onmt_lite_command(args, src, os.path.join(work, "startup.txt"), *options)
            times.append(run_once(cmd, env, name)["process_s"])
        rows.append({"case": name, "process_s": statistics.median(times), "min": min(times),
                     "max": max(times)})
        print(f"{name:32} {statistics.median(times):6.2f} s ({min(times):.2f}-{max(times):.2f})")
    return rows


def memory(args, work):
    """Peak RSS translating ``-memory_base`` lines and ``-memory_lines`` lines (the source
    repeated): streamed input keeps it flat."""
    with open(args.src, encoding="utf-8") as f:
        lines = f.read().split("\n")[:-1]
    rows = []
    for n in (args.memory_base, args.memory_lines):
        src = os.path.join(work, f"memory.{n}.src")
        with open(src, "w", encoding="utf-8") as f:
            for i in range(n):
                f.write(lines[i % len(lines)] + "\n")
        out = os.path.join(work, f"memory.{n}.txt")
        run = run_once(onmt_lite_command(args, src, out))
        seconds, rss, summed = run["translate_s"], run["peak_rss_mib"], run["peak_rss_sum_mib"]
        with open(out, encoding="utf-8") as f:
            assert sum(1 for _ in f) == n
        rows.append({"lines": n, "translate_s": seconds, "peak_rss_mib": rss,
                     "peak_rss_sum_mib": summed, "peak_pss_sum_mib": run["peak_pss_sum_mib"]})
        print(f"{n:>8} lines: {seconds:8.1f} s, peak RSS {rss:6.0f} MiB (all processes: RSS "
              f"{summed:6.0f} MiB, PSS {run['peak_pss_sum_mib']:6.0f} MiB)")
    return rows


ENGINE_OPTIONS = {  # onmt_lite configurations; int8 and bf16 use the batch engine
    "batch": ["-beam_engine", "batch"], "sentence": ["-beam_engine", "sentence"],
    "int8": ["-int8"], "bf16": ["-precision", "bf16"],
    # -inter_threads processes instead of threads (the later -inter_threads 1 wins)
    "workers": ["-workers", "{inter}", "-inter_threads", "1"],
    "one-process": ["-inter_threads", "1", "-threads", "{inter}"],  # one batch on all threads
    "int8-workers": ["-int8", "-workers", "{inter}", "-inter_threads", "1"],
    "bf16-workers": ["-precision", "bf16", "-workers", "{inter}", "-inter_threads", "1"],
    # the fast path, uncompiled (-fast) and compiled in the benchmark's cache folder by the
    # warm-up run (-compile)
    "fast": ["-fast"], "fast-workers": ["-fast", "-workers", "{inter}", "-inter_threads", "1"],
    "fast-int8-workers": ["-fast", "-int8", "-workers", "{inter}", "-inter_threads", "1"],
    # -int8_engine named rather than picked for the CPU (auto)
    "fast-int8-fbgemm-workers": ["-fast", "-int8", "-int8_engine", "fbgemm", "-workers",
                                 "{inter}", "-inter_threads", "1"],
    "fast-int8-onednn-workers": ["-fast", "-int8", "-int8_engine", "onednn", "-workers",
                                 "{inter}", "-inter_threads", "1"],
    "compiled": ["-compile", "-compile_cache", "{cache}"],
    "compiled-workers": ["-compile", "-compile_cache", "{cache}", "-workers", "{inter}",
                         "-inter_threads", "1"],
    "compiled-fp32-workers": ["-compile", "-compile_cache", "{cache}", "-precision", "fp32",
                             "-workers", "{inter}", "-inter_threads", "1"],
    "compiled-int8-workers": ["-compile", "-compile_cache", "{cache}", "-int8", "-workers",
                              "{inter}", "-inter_threads", "1"],
    # -fast's precision named rather than picked for the CPU (auto)
    "fast-fp32-workers": ["-fast", "-precision", "fp32", "-workers", "{inter}",
                          "-inter_threads", "1"],
    "fast-mixed-workers": ["-fast", "-precision", "mixed", "-workers", "{inter}",
                           "-inter_threads", "1"],
    "fast-bf16-workers": ["-fast", "-precision", "bf16", "-workers", "{inter}",
                          "-inter_threads", "1"],
    "compiled-bf16-workers": ["-compile", "-compile_cache", "{cache}", "-precision", "bf16",
                              "-workers", "{inter}", "-inter_threads", "1"],
    # -compile where no C++ compiler is found: the -fast step, after one line
    "compiled-no-compiler-workers": ["-compile", "-workers", "{inter}", "-inter_threads", "1"]}
NO_COMPILER = {"compiled-no-compiler-workers"}  # run with CXX pointing nowhere


def markdown(paths) -> str:
    """docs/speed.md's speed tables from -json result files, one per model (named after its file):
    the times, then the round-by-round comparisons with the peers."""
    runs = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            runs.append((os.path.splitext(os.path.basename(path))[0], json.load(f)))
    rows = ["| model | configuration (2 cores) | translate s | process s | tokens/s | peak RSS MiB "
            "| BLEU | lines as exact |", "|---|---|---|---|---|---|---|---|"]
    for model, results in runs:
        for r in results:
            t = r["translate_s"]
            rows.append(f"| {model} | {r['name']} | {t['median']:.2f} ({t['min']:.2f}–{t['max']:.2f}) "
                        f"| {r['process_s']['median']:.2f} | {r['tokens_per_s']:,.0f} "
                        f"| {r['peak_rss_mib']['median']:.0f} | {r['bleu']:.2f} "
                        f"| {100 * r['identical_to_first']:.1f}% |")
            model = ""
    return "\n\n".join(["\n".join(rows)] + [paired_markdown(model, results)
                                             for model, results in runs
                                             if any(r.get("paired_vs") for r in results)])


def paired_markdown(model: str, results: list) -> str:
    """One model's round-by-round table: each onmt_lite configuration's time as a share of each
    peer's, median (min-max), rounds won of all and the sign test's p."""
    peers = [r["name"] for r in results if not r["name"].startswith("onmt_lite")]
    rows = [f"| {model} | " + " | ".join(f"vs {peer}" for peer in peers) + " |",
            "|---" * (len(peers) + 1) + "|"]
    for r in results:
        if r.get("paired_vs"):
            rows.append(f"| {r['name'].removeprefix('onmt_lite ')} | " + " | ".join(
                f"{q['median']:.2f} ({q['min']:.2f}–{q['max']:.2f}), {q['faster']}/"
                f"{q['rounds']}, p {q['sign_p']:.2g}"
                for q in (r["paired_vs"][peer] for peer in peers)) + " |")
    return "\n".join(rows)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("-model")
    p.add_argument("-src")
    p.add_argument("-ref")
    p.add_argument("-beam_size", type=int, default=5)
    p.add_argument("-batch_size", type=int, default=32)
    p.add_argument("-threads", type=int, default=1, help="onmt_lite: intra-op threads")
    p.add_argument("-inter_threads", type=int, default=2,
                   help="onmt_lite: batches translated at the same time")
    p.add_argument("-onmt_threads", type=int, default=2, help="OpenNMT-py: torch threads")
    p.add_argument("-runs", type=int, default=3)
    p.add_argument("-warmup", type=int, default=1)
    p.add_argument("-engines", nargs="+", default=["batch", "sentence", "int8", "bf16"],
                   choices=list(ENGINE_OPTIONS))
    p.add_argument("-extra", default="", help='more translate.py options: -extra="-n_best 2"')
    p.add_argument("-peers", help="virtualenv with OpenNMT-py 3.5.1 and CTranslate2")
    p.add_argument("-ct2", nargs="+", default=["1x1", "2x1"],
                   help="CTranslate2 settings, each INTERxINTRA threads")
    p.add_argument("-json", help="also write the results here")
    p.add_argument("-growth", action="store_true",
                   help="instead: tokens/s for outputs of ~10, ~50 and ~200 tokens")
    p.add_argument("-growth_lines", type=int, default=100, help="source lines for -growth")
    p.add_argument("-memory_lines", type=int, default=0,
                   help="instead: peak RSS on -memory_base lines and on this many")
    p.add_argument("-memory_base", type=int, default=1000)
    p.add_argument("-startup", action="store_true",
                   help="instead: a fresh process's time to its first translation, exact, "
                        "-fast, -compile with an empty and a warm compile cache")
    p.add_argument("-table", nargs="+", metavar="JSON",
                   help="instead: print the markdown table of docs/speed.md from these -json files")
    args = p.parse_args(argv)
    if args.table:
        print(markdown(args.table))
        return
    if not (args.model and args.src and args.ref):
        p.error("-model, -src and -ref are required (but with -table)")
    if not all(re.fullmatch(r"\d+x\d+", setting) for setting in args.ct2):
        p.error("-ct2 settings are INTERxINTRA thread counts, e.g. 2x1")
    work = tempfile.mkdtemp(prefix="bench-")
    if args.growth or args.memory_lines or args.startup:
        results = growth(args, work) if args.growth else \
            startup(args, work) if args.startup else memory(args, work)
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(results, f, indent=1)
        return
    common = ["-model", args.model, "-src", args.src, "-beam_size", str(args.beam_size),
              "-batch_size", str(args.batch_size)]
    configs = []
    for engine in args.engines:
        out = os.path.join(work, f"onmt_lite.{engine}.txt")
        options = [o.format(inter=args.inter_threads, cache=os.path.join(work, "compiled"))
                   for o in ENGINE_OPTIONS[engine]]
        cmd = onmt_lite_command(args, args.src, out, *options)
        env = dict(os.environ, CXX="/no/compiler") if engine in NO_COMPILER else None
        configs.append((f"onmt_lite {engine}", cmd, out, env))
    if args.peers:
        env = peers_env(args)
        out = os.path.join(work, "opennmt-py.txt")
        cmd = [os.path.join(args.peers, "bin", "onmt_translate"), *common, "-output", out,
               "-gpu", "-1", "-report_time"]
        configs.append(("OpenNMT-py", cmd, out, env))
        ct2_dir = ct2_model(args, work)
        settings = [(compute, threads) for compute in ("float32", "int8") for threads in args.ct2]
        for compute, threads in settings if ct2_dir else ():
            out = os.path.join(work, f"ct2.{compute}.{threads}.txt")
            cmd = ct2_command(args, ct2_dir, args.src, out, compute, threads)
            configs.append((f"CT2 {compute} {threads}", cmd, out, env))
    results = measure(configs, args)
    with open(configs[0][2], encoding="utf-8") as f:
        first = f.read().split("\n")
    for result, (_, _, output, _) in zip(results, configs):
        with open(output, encoding="utf-8") as f:
            lines = f.read().split("\n")
        same = sum(a == b for a, b in zip(first, lines)) - 1  # the empty last "line"
        result["identical_to_first"] = same / (len(first) - 1)
    base = results[0]["translate_s"]["median"]
    print(f"{'configuration':22} {'translate s (min-max)':>24} {'process s':>10} "
          f"{'sent/s':>8} {'tok/s':>8} {'RSS MiB':>8} {'RSS sum':>8} {'PSS sum':>8} {'BLEU':>6} "
          f"{'vs first':>8} {'same lines':>10}")
    for r in results:
        t = r["translate_s"]
        r["speedup_vs_first"] = base / t["median"]
        print(f"{r['name']:22} {t['median']:8.2f} ({t['min']:.2f}-{t['max']:.2f})      "
              f"{r['process_s']['median']:10.2f} {r['sents_per_s']:8.1f} {r['tokens_per_s']:8.1f} "
              f"{r['peak_rss_mib']['median']:8.0f} {r['peak_rss_sum_mib']['median']:8.0f} "
              f"{r['peak_pss_sum_mib']['median']:8.0f} "
              f"{r['bleu']:6.2f} {r['speedup_vs_first']:7.2f}x "
              f"{100 * r['identical_to_first']:9.1f}%")
    peers = [r for r in results if not r["name"].startswith("onmt_lite")]
    if peers:
        print("onmt_lite's time as a share of each peer's, per round (runs of one round are "
              "neighbours in time), median (min-max), rounds faster, sign test p:")
    for r in results:
        if r["name"].startswith("onmt_lite"):
            r["paired_vs"] = {peer["name"]: paired_ratio(r, peer) for peer in peers}
            print(f"  {r['name']:34} " + "  ".join(
                f"{name}: {q['median']:.2f} ({q['min']:.2f}-{q['max']:.2f}) "
                f"{q['faster']}/{q['rounds']} p={q['sign_p']:.3f}"
                for name, q in r["paired_vs"].items()))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)


def paired_ratio(result: dict, peer: dict) -> dict:
    """result's translation time over peer's, round by round: a machine that slows down for a
    while slows both runs of a round, so the ratio varies less than the times do. ``faster``:
    the rounds result won; ``sign_p``: the chance of a split at least as uneven between two
    configurations equally fast (a two-sided sign test): "ahead" needs it small, not a median
    below 1."""
    ratios = [a / b for a, b in zip(result["translate_runs"], peer["translate_runs"])]
    faster, rounds = sum(r < 1 for r in ratios), len(ratios)
    tail = sum(math.comb(rounds, i) for i in range(min(faster, rounds - faster) + 1))
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
            "faster": faster, "rounds": rounds, "sign_p": min(1.0, 2 * tail / 2 ** rounds)}


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "-_child":
        child(sys.argv[2:])
    else:
        main()
