"""What a server lane's batches cost beside each other: sentences kept in flight as batches of
a given size, their decoder steps run together (models/shared_step.py), on one torch thread.

    python benchmarks/lane_bench.py -json lane.json

For each (sentences a batch, sentences in flight): a new batch joins as soon as the sentences in
flight leave room, as a lane's do under a steady load. Reported: sentences per second, beside
translate's own batches of ``-batch_size`` sorted by length, in the same process. The JSON
names the CPU.
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from defaults_bench import cpu  # noqa: E402  (a sibling script, not a package)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from onmt_lite.models.model import inference, replica  # noqa: E402
from onmt_lite.models.shared_step import Searches  # noqa: E402
from onmt_lite.translate.build import build_translator  # noqa: E402

SHARED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared")


def search(translator, tokens, join: bool):
    twin = translator.__class__.__new__(translator.__class__)
    twin.__dict__.update(translator.__dict__, model=replica(translator.model))
    return twin.batch_steps(list(range(len(tokens))), tokens, None, shared=True, join=join)


def in_flight(translator, lines, group: int, flight: int, join: bool) -> float:
    """Sentences per second with ``flight`` sentences kept in flight as batches of ``group``,
    each a search of its own or, ``join``, joining the running search."""
    queue = [translator.source_tokens(line, i + 1) for i, line in enumerate(lines)]
    searches, live, current = Searches(), 0, None
    start = time.perf_counter()
    with inference():
        while queue or searches:
            while queue and live + group <= flight:
                batch, queue = queue[:group], queue[group:]
                live += len(batch)
                if not (join and searches.offer(current, batch)):
                    current = object()
                    searches.add(current, search(translator, batch, join))
            live -= sum(kind == "ended" for _, kind, _ in searches.step())
    return len(lines) / (time.perf_counter() - start)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-model", default=os.path.join(SHARED, "fixtures", "onmt-py", "transformer.pt"))
    p.add_argument("-src", default=os.path.join(SHARED, "data", "multi30k",
                                                "test_2016_flickr.lc.tok.en"))
    p.add_argument("-lines", type=int, default=192)
    p.add_argument("-batch_size", type=int, default=32)
    p.add_argument("-settings", nargs="+", default=["16x16", "1x16", "2x16", "4x16", "1x16j",
                                                    "1x32j"],
                   help="sentences a batch x sentences in flight; j: batches join one search")
    p.add_argument("-compile", action="store_true", help="translate.py's -compile")
    p.add_argument("-json")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    translator = build_translator({"model": args.model, "beam_size": 5, "compile": args.compile})
    with open(args.src, encoding="utf-8") as f:
        lines = [line.strip() for _, line in zip(range(args.lines), f)]
    start = time.perf_counter()
    translator.translate(lines, batch_size=args.batch_size)
    results = {"cpu": cpu(), "lines": len(lines), "compile": args.compile,
               "translate": len(lines) / (time.perf_counter() - start), "in_flight": {}}
    print(f"translate, batches of {args.batch_size} sorted: {results['translate']:.1f} sent/s")
    for setting in args.settings:
        group, flight = (int(x) for x in setting.rstrip("j").split("x"))
        rate = in_flight(translator, lines, group, flight, setting.endswith("j"))
        results["in_flight"][setting] = rate
        how = "joining one search" if setting.endswith("j") else "each a search"
        print(f"batches of {group}, {flight} in flight, {how}: {rate:.1f} sent/s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
