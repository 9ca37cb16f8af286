"""The same translations on a GPU: each decoding path on CUDA against exact decoding on the CPU.

    python benchmarks/gpu_check.py -model data/multi30k_en_de.pt \
        -src ../shared/data/multi30k/test_2016_flickr.lc.tok.en \
        -tgt ../shared/data/multi30k/test_2016_flickr.lc.tok.de -json gpu.json

For each configuration (exact fp32, ``-fast``, ``-precision bf16``, ``-compile``, beam 5, batch
``-batch_size``) on ``cuda:0``: its translation time (the second of two runs, the GPU
synchronised), the share of lines identical to exact decoding on the CPU, BLEU against ``-tgt``,
or the error it raised, one line. ``joined`` decodes the sentences as the server's lanes do,
one arriving every other step and joining the running search, and also gives the share of
lines identical to each sentence decoded alone on the GPU (``-max_length_ratio 0``, so that no
limit depends on the other sentences). The JSON names the GPU and the CPU.
"""
import argparse
import json
import os
import sys
import time

import sacrebleu
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from onmt_lite.translate.build import build_translator  # noqa: E402

CONFIGS = {
    "exact fp32": {},
    "-fast": {"fast": True},
    "-precision bf16": {"precision": "bf16"},
    "-compile": {"compile": True},
    "joined": {"max_length_ratio": 0},
}


def translate(options: dict, lines, batch_size: int, device: str):
    translator = build_translator(options)
    seconds = None
    for _ in range(2):  # the first run warms the kernels (and compiles)
        start = time.perf_counter()
        outputs = [t.output_lines()[0] for t in translator.translate(lines, batch_size=batch_size)]
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    return outputs, seconds


def joined(options: dict, lines):
    """``lines`` decoded by a lane (serve/lanes.py), one arriving every other step."""
    from types import SimpleNamespace

    from onmt_lite.models.model import inference
    from onmt_lite.serve.lane_process import Turns, _Batch, _LaneSearches
    translator = build_translator(options)
    lane, messages = _LaneSearches(translator, Turns(0.5)), []
    conn = SimpleNamespace(send=messages.append)
    start = time.perf_counter()
    with inference():
        for i, line in enumerate(lines):
            tokens = translator.source_tokens(line, 1)
            lane.admit(conn, _Batch(i, [0], False, [len(tokens)]), [tokens], 1)
            for _ in range(2):
                if lane.busy():
                    lane.step(conn)
        while lane.busy():
            lane.step(conn)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    found = {m[1]: m[3][0][0] for m in messages if m[0] == "sentence"}
    alone = [t.output_lines()[0] for t in translator.translate(lines, batch_size=1)]
    return [found[i] for i in range(len(lines))], seconds, alone


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-model", required=True)
    p.add_argument("-src", required=True)
    p.add_argument("-tgt", help="references, for BLEU")
    p.add_argument("-lines", type=int, default=1000)
    p.add_argument("-batch_size", type=int, default=64)
    p.add_argument("-configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("-json")
    args = p.parse_args(argv)
    with open(args.src, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for _, line in zip(range(args.lines), f)]
    refs = None
    if args.tgt:
        with open(args.tgt, encoding="utf-8") as f:
            refs = [line.rstrip("\n") for _, line in zip(range(args.lines), f)]
    base = {"model": args.model, "beam_size": 5}
    exact, cpu_seconds = translate(dict(base, gpu=-1), lines, args.batch_size, "cpu")
    results = {"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
               "torch": torch.__version__, "lines": len(lines), "cpu_threads":
               torch.get_num_threads(), "cpu exact fp32": {"seconds": cpu_seconds}}
    if refs:
        results["cpu exact fp32"]["bleu"] = sacrebleu.corpus_bleu(exact, [refs]).score
    for name in args.configs:
        alone = None
        try:
            if name == "joined":
                out, seconds, alone = joined(dict(base, gpu=0, **CONFIGS[name]), lines)
            else:
                out, seconds = translate(dict(base, gpu=0, **CONFIGS[name]), lines,
                                         args.batch_size, "cuda")
        except Exception as err:  # noqa: BLE001 - reported, the other configurations run
            results[name] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0]}"}
        else:
            same = sum(a == b for a, b in zip(out, exact)) / len(exact)
            results[name] = {"seconds": seconds, "identical_to_cpu_exact": same,
                             "speedup_vs_cpu_exact": cpu_seconds / seconds}
            if refs:
                results[name]["bleu"] = sacrebleu.corpus_bleu(out, [refs]).score
            if alone is not None:
                results[name]["identical_to_alone"] = sum(map(str.__eq__, out, alone)) / len(out)
        print(name, json.dumps(results[name]), flush=True)
    print(json.dumps(results, indent=1))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
