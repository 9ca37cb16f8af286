"""Thread settings on an idle and on a busy CPU: how translate.py's speed holds up when other
programs use the cores.

    python benchmarks/threads_bench.py -model data/multi30k_en_de.pt -src SRC -lines 100 -json F

Each setting runs in its own process, ``-runs`` times, the settings taking turns; first on an
idle machine, then with one spinning process per core started beside it ("busy"). Reported per
setting and load: the median (min-max) translation time as translate.py reports it, and its
ratio to onmt_lite's default setting under the same load. The default decodes the batches side
by side in forked processes, one per core on one torch thread each ("-threads 1 -inter_threads
N": on threads of one process instead); "-threads N" decodes one batch at a time on N
intra-op threads, whose OpenMP threads sleep while they wait (OMP_WAIT_POLICY=PASSIVE, set by
onmt_lite); "spin-wait" is OpenMP's own default (threads spin before they sleep), which an empty
OMP_WAIT_POLICY gives back.
"""
import argparse
import json
import multiprocessing
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name -> (extra environment, extra translate.py options)
CORES = str(len(os.sched_getaffinity(0)))
SETTINGS = {
    "default": ({}, []),
    f"-threads 1 -inter_threads {CORES}": ({}, ["-threads", "1", "-inter_threads", CORES]),
    f"-threads {CORES} (passive wait)": ({}, ["-threads", CORES]),
    f"-threads {CORES}, spin-wait": ({"OMP_WAIT_POLICY": ""}, ["-threads", CORES]),
    "-threads 1": ({}, ["-threads", "1"]),
}


def _spin() -> None:
    while True:
        pass


def translation_time(args, src: str, env: dict, options: list) -> float:
    with tempfile.NamedTemporaryFile(suffix=".txt") as out:
        cmd = [sys.executable, os.path.join(ROOT, "translate.py"), "-model", args.model, "-src",
               src, "-output", out.name, "-beam_size", str(args.beam_size), "-batch_size",
               str(args.batch_size), "-report_time", "-no_progress", *options]
        environment = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
        done = subprocess.run(cmd, env={**environment, **env}, capture_output=True, text=True,
                              timeout=args.timeout)
    if done.returncode != 0:
        sys.exit(done.stderr[-2000:])
    return float(re.search(r"Total translation time \(s\): ([\d.]+)", done.stderr).group(1))


def measure(args, src: str, load: str) -> dict:
    times = {name: [] for name in SETTINGS}
    for run in range(args.runs):
        for name, (env, options) in SETTINGS.items():
            seconds = translation_time(args, src, env, options)
            times[name].append(seconds)
            print(f"{load:5} run {run + 1}: {name:30} {seconds:7.2f} s", file=sys.stderr)
    base = statistics.median(times["default"])
    return {name: {"median_s": statistics.median(t), "min_s": min(t), "max_s": max(t),
                   "vs_default": statistics.median(t) / base, "runs": t}
            for name, t in times.items()}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-model", default=os.path.join(ROOT, "data", "multi30k_en_de.pt"))
    p.add_argument("-src", required=True)
    p.add_argument("-lines", type=int, default=100, help="first N lines of -src")
    p.add_argument("-beam_size", type=int, default=5)
    p.add_argument("-batch_size", type=int, default=32)
    p.add_argument("-runs", type=int, default=3)
    p.add_argument("-timeout", type=int, default=600, help="seconds per run at most")
    p.add_argument("-loads", nargs="+", default=["idle", "busy"], choices=["idle", "busy"],
                   help="the CPU as the runs find it, or every core kept busy by a spinner")
    p.add_argument("-json", help="also write the figures here")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        src = os.path.join(work, "src.txt")
        with open(args.src, encoding="utf-8") as f, open(src, "w", encoding="utf-8") as out:
            out.writelines(line for _, line in zip(range(args.lines), f))
        results = {"idle": measure(args, src, "idle")} if "idle" in args.loads else {}
        if "busy" in args.loads:
            spinners = [multiprocessing.Process(target=_spin, daemon=True)
                        for _ in range(os.cpu_count() or 1)]
            for proc in spinners:
                proc.start()
            try:
                results["busy"] = measure(args, src, "busy")
            finally:
                for proc in spinners:
                    proc.terminate()
    print(f"{'setting':32} {'load':5} {'median s':>9} {'min-max s':>15} {'vs default':>10}")
    for load, table in results.items():
        for name, r in table.items():
            print(f"{name:32} {load:5} {r['median_s']:9.2f} "
                  f"{r['min_s']:7.2f}-{r['max_s']:<7.2f} {r['vs_default']:10.2f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"cores": os.cpu_count(), "lines": args.lines, "results": results}, f,
                      indent=1)


if __name__ == "__main__":
    main()
