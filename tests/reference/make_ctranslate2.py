"""Makes tests/reference/ctranslate2.json: CTranslate2's own beam search on the OpenNMT-py
Transformer fixture and on a tiny Marian model, for test_search_ctranslate2.py. CTranslate2 is
not a dependency: run this with the peers virtualenv (../shared/peers/setup-peers.sh, plus
``pip install transformers==5.23.0`` for the Marian converter), from the repository root:

    ~/onmt-peers/bin/python tests/reference/make_ctranslate2.py

The Marian model (tests/reference/marian_tiny, written here by tests/marian_dirs.py) is
converted with CTranslate2's Transformers converter; its sources are tokenized by its
MarianTokenizer (pieces and the closing ``</s>``), as CTranslate2's documentation does.

Two more Marian models that misbehave (tests/reference/marian_never_ends, marian_ends_at_once)
check the limits and translate_batch's own defaults.

The model is converted with CTranslate2's own OpenNMT-py converter (the checkpoint's
argparse.Namespace allowed, its "scaled-dot-flash" attention named "scaled-dot", the only name
the converter accepts: the same attention). Each case translates the first LINES lines of the
lowercased, tokenized test_2016_flickr source with translate_batch and records every returned
hypothesis (tokens, without </s>) and its score.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

import ctranslate2
import torch
from ctranslate2.converters import OpenNMTPyConverter, TransformersConverter

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.path.join(HERE, "..", "..", "..", "shared")
MODEL = os.path.join(SHARED, "fixtures", "onmt-py", "transformer.pt")
SOURCE = os.path.join(SHARED, "data", "multi30k", "test_2016_flickr.lc.tok.en")
TARGET = SOURCE[:-len(".en")] + ".de"
MARIAN = os.path.join(HERE, "marian_tiny")
LINES = 150
# name -> translate_batch arguments (beam search; CTranslate2's defaults otherwise)
CASES = {
    "beam 5": dict(beam_size=5),
    "beam 5, length_penalty 0, 3 hypotheses": dict(beam_size=5, length_penalty=0.0,
                                                    num_hypotheses=3),
    "beam 4, patience 2, length_penalty 0.6, 2 hypotheses": dict(
        beam_size=4, patience=2.0, length_penalty=0.6, num_hypotheses=2),
    "beam 5, decoding length 8 to 12": dict(beam_size=5, min_decoding_length=8,
                                            max_decoding_length=12),
    "beam 3, repetition_penalty 1.2, no_repeat_ngram_size 2": dict(
        beam_size=3, repetition_penalty=1.2, no_repeat_ngram_size=2),
    "beam 6, length_penalty 2, 6 hypotheses": dict(beam_size=6, length_penalty=2.0,
                                                   num_hypotheses=6),
    "greedy": dict(beam_size=1),
    "beam 4, min_decoding_length 0": dict(beam_size=4, min_decoding_length=0),
}
# target prefixes: the first two reference words of two lines in three, none for the others
PREFIX_CASES = {
    "beam 5, target prefix": dict(beam_size=5),
    "beam 4, target prefix, length_penalty 0, 4 hypotheses": dict(
        beam_size=4, length_penalty=0.0, num_hypotheses=4),
    "greedy, target prefix": dict(beam_size=1),
}
# models that misbehave, written beside marian_tiny: one never ends by itself (every hypothesis
# meets the limit), one likes </s> at once; translate_batch's own defaults among the cases
EDGE_MODELS = {"never_ends": dict(seed=2, eos_bias=-30.0, max_position_embeddings=300),
               "ends_at_once": dict(seed=3, eos_bias=6.0, max_position_embeddings=300)}
EDGE_LINES = 12
EDGE_CASES = {
    "beam 2, translate_batch's defaults": dict(beam_size=2),
    "greedy, translate_batch's defaults": dict(beam_size=1),
    "beam 4, 4 hypotheses, decoding length 0 to 6": dict(
        beam_size=4, num_hypotheses=4, min_decoding_length=0, max_decoding_length=6),
    "beam 3, patience 2, length_penalty 0, decoding length 3 to 10": dict(
        beam_size=3, patience=2.0, length_penalty=0.0, min_decoding_length=3,
        max_decoding_length=10),
}
MARIAN_LINES = 48
MARIAN_CASES = {
    "beam 4, 2 hypotheses": dict(beam_size=4, num_hypotheses=2, max_decoding_length=100),
    "beam 5, length_penalty 0": dict(beam_size=5, length_penalty=0.0, max_decoding_length=100),
    "greedy": dict(beam_size=1, max_decoding_length=100),
    "beam 3, repetition_penalty 1.3, no_repeat_ngram_size 2, decoding length 2 to 9": dict(
        beam_size=3, repetition_penalty=1.3, no_repeat_ngram_size=2, min_decoding_length=2,
        max_decoding_length=9),
}


def convert(folder: str) -> None:
    torch.serialization.add_safe_globals([argparse.Namespace])
    ckpt = torch.load(MODEL, map_location="cpu", weights_only=True)
    if getattr(ckpt["opt"], "self_attn_type", None) == "scaled-dot-flash":
        ckpt["opt"].self_attn_type = "scaled-dot"
    with tempfile.NamedTemporaryFile(suffix=".pt") as f:
        torch.save(ckpt, f.name)
        OpenNMTPyConverter(f.name).convert(folder, force=True)


def prefixes(lines):
    return [words[:2] if i % 3 != 1 else [] for i, words in enumerate(lines)]


def run(translator, sources, cases, **extra):
    out = {}
    for name, options in cases.items():
        results = translator.translate_batch(sources, max_batch_size=32, return_scores=True,
                                             **options, **extra)
        out[name] = {"options": options, "hypotheses": [
            [[" ".join(h), round(s, 6)] for h, s in zip(r.hypotheses, r.scores)]
            for r in results]}
    return out


def marian_cases(folder: str):
    sys.path.insert(0, os.path.join(HERE, ".."))
    from marian_dirs import SOURCES, sentences, write_marian
    from transformers import MarianTokenizer
    shutil.rmtree(MARIAN, ignore_errors=True)
    write_marian(MARIAN, seed=6, eos_bias=3.0)
    TransformersConverter(MARIAN).convert(folder, force=True)
    tokenizer = MarianTokenizer.from_pretrained(MARIAN)
    lines = SOURCES + sentences(MARIAN_LINES - len(SOURCES), 7)
    sources = [tokenizer.convert_ids_to_tokens(tokenizer.encode(line)) for line in lines]
    translator = ctranslate2.Translator(folder, device="cpu", compute_type="float32",
                                        inter_threads=1, intra_threads=1)
    return lines, run(translator, sources, MARIAN_CASES)


def edge_cases(folder: str):
    sys.path.insert(0, os.path.join(HERE, ".."))
    from marian_dirs import SOURCES, sentences, write_marian
    from transformers import MarianTokenizer
    lines = SOURCES[:EDGE_LINES - 6] + sentences(5, 3) + [""]
    out = {"lines": lines, "models": {}}
    for name, arguments in EDGE_MODELS.items():
        model_dir = os.path.join(HERE, f"marian_{name}")
        shutil.rmtree(model_dir, ignore_errors=True)
        write_marian(model_dir, **arguments)
        converted = os.path.join(folder, name)
        TransformersConverter(model_dir).convert(converted, force=True)
        tokenizer = MarianTokenizer.from_pretrained(model_dir)
        sources = [tokenizer.convert_ids_to_tokens(tokenizer.encode(line)) for line in lines]
        translator = ctranslate2.Translator(converted, device="cpu", compute_type="float32",
                                            inter_threads=1, intra_threads=1)
        out["models"][name] = run(translator, sources, EDGE_CASES)
    return out


def main() -> None:
    with open(SOURCE, encoding="utf-8") as f:
        lines = [next(f).split() for _ in range(LINES)]
    with open(TARGET, encoding="utf-8") as f:
        targets = [next(f).split() for _ in range(LINES)]
    out = {"made_by": "tests/reference/make_ctranslate2.py",
           "ctranslate2": ctranslate2.__version__, "torch": torch.__version__,
           "model": "../shared/fixtures/onmt-py/transformer.pt",
           "source": f"first {LINES} lines of test_2016_flickr.lc.tok.en",
           "prefixes": prefixes(targets)}
    with tempfile.TemporaryDirectory() as folder:
        convert(folder)
        translator = ctranslate2.Translator(folder, device="cpu", compute_type="float32",
                                            inter_threads=1, intra_threads=1)
        out["cases"] = run(translator, lines, CASES)
        out["prefix_cases"] = run(translator, lines, PREFIX_CASES,
                                  target_prefix=out["prefixes"])
    with tempfile.TemporaryDirectory() as folder:
        out["marian_lines"], out["marian_cases"] = marian_cases(folder)
    with tempfile.TemporaryDirectory() as folder:
        out["edge_cases"] = edge_cases(folder)
    with open(os.path.join(HERE, "ctranslate2.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
        f.write("\n")


if __name__ == "__main__":
    main()
