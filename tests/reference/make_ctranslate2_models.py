"""Makes the CTranslate2 model directories that test_ctranslate2_models.py reads, and
CTranslate2's own translations of them. CTranslate2 is not a dependency: run this with the peers
virtualenv (../shared/peers/setup-peers.sh, plus ``pip install transformers==5.23.0`` for the
Marian converter), from the repository root:

    ~/onmt-peers/bin/python tests/reference/make_ctranslate2_models.py

writes tests/reference/ct2_tiny/ (small models made by CTranslate2's own converter and
serializer) and tests/reference/ctranslate2_models.json:

- ``marian_float32``, ``marian_float16``, ``marian_int8``: tests/reference/marian_tiny through
  CTranslate2's Transformers converter (post-norm, stored position tables, a decoder that starts
  from a zero embedding, <pad> left out of the vocabulary, biases, swish);
- ``prenorm_float32``, ``prenorm_int8``: a pre-norm TransformerSpec with seeded random weights
  saved by CTranslate2's ModelSpec.save (no stored position table: CTranslate2's own sinusoids;
  GELU; no biases; one embedding for source, target and output, so aliases; no padding token;
  add_source_eos).

The translations are translate_batch's on whitespace tokens (the Marian model's sources are its
MarianTokenizer's pieces with the closing </s>), with compute_type float32; an int8 model's are
also recorded with compute_type int8 (what CTranslate2 runs by default), as a measurement.

``--fixtures DIR`` converts the two OpenNMT-py fixtures (../shared/fixtures/onmt-py/transformer.pt
and onmt-py-spm/model.pt, the latter also to int8) into DIR/transformer, DIR/spm and
DIR/spm_int8 and writes tests/reference/ctranslate2_fixtures.json: CTranslate2's translations of
the first FIXTURE_LINES test lines (lowercased and tokenized for the word model, sentencepiece
pieces of the raw text for the other) and, for the int8 model, of the whole test set with
compute_type int8 and float32. Point ONMT_LITE_CT2_FIXTURES at DIR to test them.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import torch

try:  # the peers environment
    import ctranslate2
    from ctranslate2.converters import OpenNMTPyConverter, TransformersConverter
    from ctranslate2.specs import common_spec, transformer_spec
except ImportError:
    ctranslate2 = None

import make_ctranslate2  # noqa: E402  (beside this script: its run() records the cases)

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.path.join(HERE, "..", "..", "..", "shared")
TINY = os.path.join(HERE, "ct2_tiny")
MARIAN = os.path.join(HERE, "marian_tiny")
DATA = os.path.join(SHARED, "data", "multi30k")
FIXTURES = {"transformer": os.path.join(SHARED, "fixtures", "onmt-py", "transformer.pt"),
            "spm": os.path.join(SHARED, "fixtures", "onmt-py-spm", "model.pt")}
SPM = os.path.join(SHARED, "fixtures", "onmt-py-spm", "spm.model")
FIXTURE_LINES = 100
CASES = {
    "beam 4, 2 hypotheses": dict(beam_size=4, num_hypotheses=2, max_decoding_length=40),
    "beam 5, length_penalty 0.2": dict(beam_size=5, length_penalty=0.2, max_decoding_length=40),
    "greedy": dict(beam_size=1, max_decoding_length=40),
    "beam 3, decoding length 2 to 9": dict(beam_size=3, min_decoding_length=2,
                                           max_decoding_length=9),
}
FIXTURE_CASES = {
    "beam 5": dict(beam_size=5),
    "greedy": dict(beam_size=1),
    "argos: beam 4, length_penalty 0.2, replace_unknowns": dict(
        beam_size=4, length_penalty=0.2, replace_unknowns=True),
}
WORDS = ("a man woman dog cat is riding walking on in the street park bike red blue with and "
         "near water ball").split()


def run(folder, sources, cases, compute_type="float32"):
    """make_ctranslate2.run's cases on the model in ``folder``, one thread."""
    translator = ctranslate2.Translator(folder, device="cpu", compute_type=compute_type,
                                        inter_threads=1, intra_threads=1)
    return make_ctranslate2.run(translator, sources, cases)


def _fill(spec, rng: np.random.Generator, dim: int, ff: int, vocab: int) -> None:
    """Seeded random weights for every variable of a TransformerSpec of width ``dim``."""
    def linear(layer, rows, cols):
        layer.weight = rng.normal(0, 0.4, (rows, cols)).astype(np.float32)

    def norm(layer):
        layer.gamma = (1 + rng.normal(0, 0.1, dim)).astype(np.float32)
        layer.beta = rng.normal(0, 0.1, dim).astype(np.float32)
    embedding = rng.normal(0, 0.5, (vocab, dim)).astype(np.float32)
    spec.encoder.embeddings[0].weight = embedding
    spec.decoder.embeddings.weight = embedding
    spec.decoder.projection.weight = embedding  # the three are one: stored once, aliased
    spec.decoder.projection.bias = rng.normal(0, 0.5, vocab).astype(np.float32)
    for layer in spec.encoder.layer + spec.decoder.layer:
        attentions = [layer.self_attention] + ([layer.attention] if hasattr(layer, "attention")
                                               else [])
        for attention in attentions:
            norm(attention.layer_norm)
            if attention is layer.self_attention:
                linear(attention.linear[0], 3 * dim, dim)
            else:
                linear(attention.linear[0], dim, dim)
                linear(attention.linear[1], 2 * dim, dim)
            linear(attention.linear[-1], dim, dim)
        norm(layer.ffn.layer_norm)
        linear(layer.ffn.linear_0, ff, dim)
        linear(layer.ffn.linear_1, dim, ff)
    norm(spec.encoder.layer_norm)
    norm(spec.decoder.layer_norm)


def prenorm_model(folder: str, quantization: str) -> list:
    """The pre-norm model in ``folder``; returns its vocabulary."""
    tokens = ["<unk>", "<s>", "</s>"] + WORDS
    spec = transformer_spec.TransformerSpec.from_config(
        (2, 1), 2, activation=common_spec.Activation.GELU)
    _fill(spec, np.random.default_rng(5), dim=16, ff=32, vocab=len(tokens))
    spec.config.add_source_eos = True
    spec.register_source_vocabulary(tokens)
    spec.register_target_vocabulary(tokens)
    spec.validate()
    spec.optimize(quantization=quantization)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    spec.save(folder)
    return tokens


def tiny() -> dict:
    sys.path.insert(0, os.path.join(HERE, ".."))
    from marian_dirs import SOURCES, sentences
    from transformers import MarianTokenizer
    out = {"made_by": "tests/reference/make_ctranslate2_models.py",
           "ctranslate2": ctranslate2.__version__, "models": {}}
    tokenizer = MarianTokenizer.from_pretrained(MARIAN)
    marian_lines = [" ".join(tokenizer.convert_ids_to_tokens(tokenizer.encode(line)))
                    for line in SOURCES + sentences(16, 7) if line.strip()]
    rng = np.random.default_rng(3)
    prenorm_lines = [" ".join(rng.choice(WORDS, int(rng.integers(1, 9)))) for _ in range(24)]
    for quantization in ("float32", "float16", "int8"):
        name = f"marian_{quantization}"
        folder = os.path.join(TINY, name)
        shutil.rmtree(folder, ignore_errors=True)
        TransformersConverter(MARIAN).convert(folder, quantization=quantization, force=True)
        out["models"][name] = {"lines": marian_lines}
    for quantization in ("float32", "int8"):
        name = f"prenorm_{quantization}"
        prenorm_model(os.path.join(TINY, name), quantization)
        out["models"][name] = {"lines": prenorm_lines}
    for name, model in out["models"].items():
        folder = os.path.join(TINY, name)
        sources = [line.split() for line in model["lines"]]
        model["cases"] = run(folder, sources, CASES)
        if name.endswith("int8"):
            model["int8_cases"] = run(folder, sources, CASES, compute_type="int8")
    return out


# -- the fixtures (--fixtures DIR) ------------------------------------------------------------
def convert_fixture(checkpoint: str, folder: str, quantization=None) -> None:
    """CTranslate2's OpenNMT-py converter on a copy whose "scaled-dot-flash" attention is
    named "scaled-dot" (the same attention; the only name the converter accepts)."""
    torch.serialization.add_safe_globals([argparse.Namespace])
    ckpt = torch.load(checkpoint, map_location="cpu", weights_only=True)
    if getattr(ckpt["opt"], "self_attn_type", None) == "scaled-dot-flash":
        ckpt["opt"].self_attn_type = "scaled-dot"
    with tempfile.NamedTemporaryFile(suffix=".pt") as f:
        torch.save(ckpt, f.name)
        OpenNMTPyConverter(f.name).convert(folder, quantization=quantization, force=True)


def _lines(path: str, count=None):
    with open(path, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    return lines[:count] if count else lines


def fixtures(folder: str) -> dict:
    import sentencepiece
    os.makedirs(folder, exist_ok=True)
    convert_fixture(FIXTURES["transformer"], os.path.join(folder, "transformer"))
    convert_fixture(FIXTURES["spm"], os.path.join(folder, "spm"))
    convert_fixture(FIXTURES["spm"], os.path.join(folder, "spm_int8"), "int8")
    spm = sentencepiece.SentencePieceProcessor(model_file=SPM)
    words = _lines(os.path.join(DATA, "test_2016_flickr.lc.tok.en"), FIXTURE_LINES)
    raw = _lines(os.path.join(DATA, "test_2016_flickr.en"))
    pieces = [" ".join(spm.encode(line, out_type=str)) for line in raw]
    out = {"made_by": "tests/reference/make_ctranslate2_models.py --fixtures DIR",
           "ctranslate2": ctranslate2.__version__, "models": {}}
    out["models"]["transformer"] = {"lines": words, "cases": run(
        os.path.join(folder, "transformer"), [line.split() for line in words], FIXTURE_CASES)}
    out["models"]["spm"] = {"lines": pieces[:FIXTURE_LINES], "cases": run(
        os.path.join(folder, "spm"), [p.split() for p in pieces[:FIXTURE_LINES]], FIXTURE_CASES)}
    argos = {"argos": FIXTURE_CASES["argos: beam 4, length_penalty 0.2, replace_unknowns"]}
    int8 = os.path.join(folder, "spm_int8")
    out["models"]["spm_int8"] = {
        "lines": pieces, "cases": run(int8, [p.split() for p in pieces], argos),
        "int8_cases": run(int8, [p.split() for p in pieces], argos, compute_type="int8")}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixtures", metavar="DIR",
                        help="convert the OpenNMT-py fixtures into DIR instead")
    args = parser.parse_args()
    if args.fixtures:
        out, name = fixtures(os.path.abspath(args.fixtures)), "ctranslate2_fixtures.json"
    else:
        out, name = tiny(), "ctranslate2_models.json"
    with open(os.path.join(HERE, name), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
        f.write("\n")


if __name__ == "__main__":
    main()
