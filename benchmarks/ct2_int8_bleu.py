"""The int8 CTranslate2 conversion of the sentencepiece fixture: onmt_lite's exact decoding of
its dequantized weights against CTranslate2's own int8 translations (compute_type int8), with
argos's decoding options, on the whole test_2016_flickr set: BLEU of each against the
reference, and the share of identical lines.

    ONMT_LITE_CT2_FIXTURES=DIR .venv/bin/python benchmarks/ct2_int8_bleu.py

DIR as tests/reference/make_ctranslate2_models.py --fixtures DIR made it; CTranslate2's
translations are read from tests/reference/ctranslate2_fixtures.json.
"""
import json
import os
import sys

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


def main() -> None:
    torch.set_num_threads(1)
    folder = os.path.join(os.environ["ONMT_LITE_CT2_FIXTURES"], "spm_int8")
    with open(os.path.join(ROOT, "tests", "reference", "ctranslate2_fixtures.json"),
              encoding="utf-8") as f:
        ref = json.load(f)["models"]["spm_int8"]
    with open(os.path.join(DATA, "test_2016_flickr.de"), encoding="utf-8") as f:
        references = [line.rstrip("\n") for line in f]
    spm = sentencepiece.SentencePieceProcessor(model_file=SPM)
    translator = build_translator({"model": folder, "search": "ctranslate2", "beam_size": 4,
                                   "alpha": 0.2, "replace_unk": True})
    ours = [argos_text(spm, t.preds[0]) for t in translator.translate(ref["lines"])]
    theirs = {name: [argos_text(spm, hyps[0][0].split()) for hyps in ref[key]["argos"]
                     ["hypotheses"]] for name, key in (("int8", "int8_cases"),
                                                       ("float32", "cases"))}
    for name, lines in (("onmt_lite, dequantized fp32", ours),
                        ("CTranslate2, compute_type int8", theirs["int8"]),
                        ("CTranslate2, compute_type float32", theirs["float32"])):
        bleu = corpus_scores(lines, [references], metrics=("bleu",))[0]
        same = sum(a == b for a, b in zip(ours, lines))
        print(f"{name:<36} BLEU {bleu.score:.2f}  identical to onmt_lite: {same}/"
              f"{len(lines)} ({same / len(lines):.1%})")


if __name__ == "__main__":
    main()
