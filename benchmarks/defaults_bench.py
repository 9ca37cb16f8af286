"""The command a user types, against OpenNMT-py's and against onmt_lite's best explicit setting.

    python benchmarks/defaults_bench.py -peers ~/onmt-peers -json defaults.json

Each tool runs as a user would start it: its own defaults, no thread options, no ``OMP_*``
variables. Beside onmt_lite's default run go its explicit thread settings (``-threads 1
-inter_threads N``, ``-workers N -threads 1``, ``-threads N``, N the cores). For each model (the
OpenNMT-py Transformer and RNN fixtures), each input (``-lines`` lines of the test set, and its
first line alone) and each load (idle; one spinning process per core beside it), the
configurations take turns, ``-runs`` rounds, each run in its own process, each round starting one
configuration further on (no configuration always follows the same one). Reported: the median
translation time as each tool logs it (many lines) or the whole process's time (one line: start-up
is what a user waits for there), and its ratio to onmt_lite's default. The default is judged
against each explicit setting round by round (the median of the rounds' ratios and how many
rounds each won), since runs side by side share the machine's drift. The JSON names the CPU.
"""
import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from translate_bench import run_once  # noqa: E402  (a sibling script, not a package)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(ROOT, "..", "shared")
CORES = len(os.sched_getaffinity(0))
EXPLICIT = {  # onmt_lite's explicit settings, measured beside its default
    f"-threads 1 -inter_threads {CORES}": ["-threads", "1", "-inter_threads", str(CORES)],
    f"-workers {CORES} -threads 1": ["-workers", str(CORES), "-threads", "1"],
    f"-threads {CORES}": ["-threads", str(CORES)],
}


def cpu() -> dict:
    """The CPU's model name, flags and the cores this process may use (Linux /proc)."""
    info = {}
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    return {"model": info.get("model name", "unknown"), "cores": CORES,
            "flags": info.get("flags", "").split()}


def _spin() -> None:
    while True:
        pass


def configurations(args, model: str, src: str, work: str) -> dict:
    """name -> (command, environment): each tool's command as a user types it."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OMP_")}
    common = ["-model", model, "-src", src, "-beam_size", "5"]
    out = os.path.join(work, "out.txt")
    mine = [sys.executable, os.path.join(ROOT, "translate.py"), *common, "-output", out,
            "-report_time", "-no_progress"]
    configs = {"onmt_lite default": (mine, environment)}
    configs.update({f"onmt_lite {name}": (mine + options, environment)
                    for name, options in EXPLICIT.items()})
    if args.peers:
        peer = [os.path.join(args.peers, "bin", "onmt_translate"), *common, "-output", out,
                "-gpu", "-1", "-report_time"]
        configs["OpenNMT-py default"] = (peer, dict(environment,
                                                    TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1"))
    return configs


def measure(args, model: str, src: str, key: str, load: str) -> dict:
    times = {}
    with tempfile.TemporaryDirectory() as work:
        configs = list(configurations(args, model, src, work).items())
        for run in range(args.runs):
            turn = run % len(configs)
            for name, (cmd, env) in configs[turn:] + configs[:turn]:
                seconds = run_once(cmd, env, name)[key]
                times.setdefault(name, []).append(seconds)
                print(f"{load:4} run {run + 1}: {name:36} {seconds:7.2f} s", file=sys.stderr)
    base = statistics.median(times["onmt_lite default"])
    return {name: {"median_s": statistics.median(t), "min_s": min(t), "max_s": max(t),
                   "vs_default": statistics.median(t) / base, "runs": t}
            for name, t in times.items()}


def check_targets(table: dict, one_line: bool) -> dict:
    """The targets on one table: >= 1.5x OpenNMT-py's default on many lines, never slower on
    one; within 5% of the best explicit setting, round by round: the explicit setting the default
    trails most, by the median of the rounds' ratios."""
    default = table["onmt_lite default"]
    paired = {name: [d / e for d, e in zip(default["runs"], r["runs"])]
              for name, r in table.items() if name.startswith("onmt_lite -")}
    best = max(paired, key=lambda name: statistics.median(paired[name]))
    ratio = statistics.median(paired[best])
    targets = {"best_explicit": best, "vs_best_explicit": ratio,
               "rounds_default_not_slower": f"{sum(r <= 1 for r in paired[best])}/{len(paired[best])}",
               "within_5pct_of_best": ratio <= 1.05}
    if "OpenNMT-py default" in table:
        speedup = table["OpenNMT-py default"]["median_s"] / default["median_s"]
        targets["speedup_vs_opennmt_py"] = speedup
        targets["met_vs_opennmt_py"] = speedup >= (1.0 if one_line else 1.5)
    return targets


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-peers", help="virtualenv with OpenNMT-py (../shared/peers/setup-peers.sh)")
    p.add_argument("-models", nargs="+", default=[
        os.path.join(SHARED, "fixtures", "onmt-py", name) for name in ("transformer.pt", "rnn.pt")])
    p.add_argument("-src", default=os.path.join(SHARED, "data", "multi30k",
                                                "test_2016_flickr.lc.tok.en"))
    p.add_argument("-lines", type=int, default=1000)
    p.add_argument("-runs", type=int, default=3)
    p.add_argument("-loads", nargs="+", default=["idle", "busy"], choices=["idle", "busy"])
    p.add_argument("-inputs", nargs="+", default=["lines", "one"], choices=["lines", "one"],
                   help="the -lines lines, the first line alone")
    p.add_argument("-json", help="also write the figures here")
    args = p.parse_args(argv)
    results = {"cpu": cpu(), "lines": args.lines, "runs": args.runs, "tables": []}
    with tempfile.TemporaryDirectory() as work:
        inputs = {}
        counts = {"lines": args.lines, "one": 1}
        for lines in (counts[name] for name in args.inputs):
            inputs[lines] = os.path.join(work, f"src.{lines}.txt")
            with open(args.src, encoding="utf-8") as f, \
                    open(inputs[lines], "w", encoding="utf-8") as out:
                out.writelines(line for _, line in zip(range(lines), f))
        for load in args.loads:
            spinners = [multiprocessing.Process(target=_spin, daemon=True)
                        for _ in range(CORES if load == "busy" else 0)]
            for proc in spinners:
                proc.start()
            try:
                for model in args.models:
                    for lines, src in inputs.items():
                        key = "process_s" if lines == 1 else "translate_s"
                        table = measure(args, model, src, key, load)
                        results["tables"].append({
                            "model": os.path.basename(model), "lines": lines, "load": load,
                            "seconds": key, "results": table,
                            "targets": check_targets(table, lines == 1)})
            finally:
                for proc in spinners:
                    proc.terminate()
    print(f"CPU: {results['cpu']['model']}, {CORES} cores")
    print(f"{'model':16} {'lines':>5} {'load':5} {'configuration':36} {'median s':>9} "
          f"{'min-max s':>15} {'vs default':>10}")
    for t in results["tables"]:
        for name, r in t["results"].items():
            print(f"{t['model']:16} {t['lines']:5} {t['load']:5} {name:36} {r['median_s']:9.2f} "
                  f"{r['min_s']:7.2f}-{r['max_s']:<7.2f} {r['vs_default']:10.2f}")
        print(f"{'':28} targets: {json.dumps(t['targets'])}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
