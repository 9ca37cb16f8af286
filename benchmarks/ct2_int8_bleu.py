"""The int8 CTranslate2 conversion of the sentencepiece fixture: onmt_lite's default for a model
stored in int8 (the fast path with its own int8 weights) and its exact decoding of the
dequantized weights (-precision fp32), against CTranslate2's own translations (compute_type int8
and float32), with argos's decoding options, on the whole test_2016_flickr set: BLEU of each
against the reference, the share of lines identical to onmt_lite's exact decoding, and
onmt_lite's decoding time (one thread, best of ``-rounds``), then the same as JSON.

    ONMT_LITE_CT2_FIXTURES=DIR .venv/bin/python benchmarks/ct2_int8_bleu.py [-rounds 3]

DIR as tests/reference/make_ctranslate2_models.py --fixtures DIR made it; CTranslate2's
translations are read from tests/reference/ctranslate2_fixtures.json.
"""
import argparse
import json
import os
import platform
import sys
import time

import sentencepiece
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from onmt_lite.evaluate import corpus_scores  # noqa: E402
from onmt_lite.translate import build_translator  # noqa: E402

DATA = os.path.join(ROOT, "..", "shared", "data", "multi30k")
SPM = os.path.join(ROOT, "..", "shared", "fixtures", "onmt-py-spm", "spm.model")


def argos_text(spm, pieces) -> str:
    text = spm.decode_pieces(list(pieces)).replace("\u2581", " ").replace("_", " ")
    return text[1:] if text.startswith(" ") else text


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next(line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    folder = os.path.join(os.environ["ONMT_LITE_CT2_FIXTURES"], "spm_int8")
    with open(os.path.join(ROOT, "tests", "reference", "ctranslate2_fixtures.json"),
              encoding="utf-8") as f:
        ref = json.load(f)["models"]["spm_int8"]
    with open(os.path.join(DATA, "test_2016_flickr.de"), encoding="utf-8") as f:
        references = [line.rstrip("\n") for line in f]
    spm = sentencepiece.SentencePieceProcessor(model_file=SPM)
    argos = {"model": folder, "search": "ctranslate2", "beam_size": 4, "alpha": 0.2,
             "replace_unk": True}
    translators = {"onmt_lite, stored int8 (default)": build_translator(argos),
                   "onmt_lite, dequantized fp32 (exact)": build_translator(
                       dict(argos, precision="fp32"))}
    lines, seconds = {}, {}
    for _ in range(args.rounds):  # the two alternate, each round
        for name, translator in translators.items():
            start = time.perf_counter()
            found = [argos_text(spm, t.preds[0]) for t in translator.translate(ref["lines"])]
            seconds[name] = min(seconds.get(name, float("inf")), time.perf_counter() - start)
            lines[name] = found
    exact = lines["onmt_lite, dequantized fp32 (exact)"]
    for name, key in (("CTranslate2, compute_type int8", "int8_cases"),
                      ("CTranslate2, compute_type float32", "cases")):
        lines[name] = [argos_text(spm, hyps[0][0].split())
                       for hyps in ref[key]["argos"]["hypotheses"]]
    rows = []
    print(f"{cpu_name()}, torch {torch.__version__}, one thread, {len(exact)} lines")
    for name, found in lines.items():
        bleu = corpus_scores(found, [references], metrics=("bleu",))[0].score
        same = sum(a == b for a, b in zip(exact, found))
        rows.append({"decoding": name, "bleu": round(bleu, 2), "identical_to_exact": same,
                     "lines": len(found), "seconds": seconds.get(name)})
        took = f"  {seconds[name]:.2f} s" if name in seconds else ""
        print(f"{name:<38} BLEU {bleu:.2f}  identical to exact: {same}/{len(found)} "
              f"({same / len(found):.1%}){took}")
    print(json.dumps({"cpu": cpu_name(), "torch": torch.__version__, "rows": rows}))


if __name__ == "__main__":
    main()
