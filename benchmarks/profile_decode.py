"""Where decoding time goes: torch.profiler's time per operation, in a few groups.

    python benchmarks/profile_decode.py -model M.pt -src SRC [-threads 1] [-json F]
        [-extra="-precision bf16"]

Translates the first 64 lines once to warm up, then all of -src twice: plainly, for the wall
time, and under the profiler, for each operation's own time. Matrix products are the floor of
exact fp32 decoding: every search that gives OpenNMT-py's output computes the same ones. What
the operations do not account for is Python and operator dispatch (and the profiler's own cost).
Batches run one at a time (with -inter_threads the operations of two threads would overlap).
"""
import argparse
import json
import shlex
import time

import torch
from torch.profiler import ProfilerActivity, profile

from onmt_lite.translate.build import build_translator
from onmt_lite.translate.flags import build_parser

GROUPS = {  # operation name -> group; anything else is "other operations"
    "matrix products": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm",
                        "aten::mkldnn_rnn_layer", "mkldnn::_linear_pointwise",
                        "quantized::linear_dynamic", "quantized::linear_relu_dynamic",
                        "aten::_int_mm"),
    "softmax, log_softmax": ("aten::_softmax", "aten::_log_softmax"),
    "copies and row selections": ("aten::copy_", "aten::index_select", "aten::cat",
                                  "aten::gather", "aten::index_copy_", "aten::index_put_",
                                  "aten::stack"),
    "top-k": ("aten::topk", "aten::amax", "aten::sort"),
}


def group_times(events) -> dict:
    """Seconds spent in each group's operations (their own time, children excluded); work done
    inside a product (addmm's copy of the bias into its output) counts as the product's."""
    group_of = {name: group for group, names in GROUPS.items() for name in names}
    times = dict.fromkeys(list(GROUPS) + ["other operations"], 0.0)
    for event in events:
        group, parent = group_of.get(event.name, "other operations"), event.cpu_parent
        while parent is not None:
            if group_of.get(parent.name) == "matrix products":
                group = "matrix products"
            parent = parent.cpu_parent
        times[group] += event.self_cpu_time_total / 1e6
    return times


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("-model", required=True)
    p.add_argument("-src", required=True)
    p.add_argument("-beam_size", type=int, default=5)
    p.add_argument("-batch_size", type=int, default=32)
    p.add_argument("-threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("-extra", default="", help='translate.py options: -extra="-precision bf16"')
    p.add_argument("-json", help="also write the results here")
    args = p.parse_args(argv)
    opt = build_parser().parse_args(["-model", args.model, "-src", args.src, "-beam_size",
                                     str(args.beam_size), *shlex.split(args.extra)])
    if opt.inter_threads > 1:
        p.error("-inter_threads: batches run one at a time here, so operations do not overlap")
    opt.inter_threads = 1  # not the default layout's side by side batches
    torch.set_num_threads(args.threads)
    translator = build_translator(vars(opt))
    with open(args.src, encoding="utf-8") as f:
        lines = f.read().splitlines()
    translator.translate(lines[:64], batch_size=args.batch_size)
    start = time.perf_counter()
    translator.translate(lines, batch_size=args.batch_size)
    wall = time.perf_counter() - start
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        translator.translate(lines, batch_size=args.batch_size)
        profiled_wall = time.perf_counter() - start
    times = group_times(prof.events())
    times["Python, dispatch, profiler"] = max(0.0, profiled_wall - sum(times.values()))
    total = sum(times.values())
    result = {"model": args.model, "lines": len(lines), "threads": args.threads,
              "options": args.extra, "wall_s": wall, "profiled_wall_s": profiled_wall,
              "groups": {name: {"seconds": s, "share": s / total} for name, s in times.items()}}
    print(f"{len(lines)} lines, {args.threads} thread(s): {wall:.2f} s "
          f"({profiled_wall:.2f} s under the profiler)")
    for name, value in result["groups"].items():
        print(f"  {name:28} {value['seconds']:7.2f} s  {100 * value['share']:5.1f} %")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
