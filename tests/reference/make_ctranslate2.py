"""Makes tests/reference/ctranslate2.json: CTranslate2's own beam search on the OpenNMT-py
Transformer fixture and on a tiny Marian model, for test_search_ctranslate2.py. CTranslate2 is
not a dependency: run this with the peers virtualenv (../shared/peers/setup-peers.sh, plus
``pip install transformers==5.23.0`` for the Marian converter), from the repository root:

    ~/onmt-peers/bin/python tests/reference/make_ctranslate2.py

The Marian model (tests/reference/marian_tiny, written here by tests/marian_dirs.py) is
converted with CTranslate2's Transformers converter; its sources are tokenized by its
MarianTokenizer (pieces and the closing ``</s>``), as CTranslate2's documentation does.

Two more Marian models that misbehave (tests/reference/marian_never_ends, marian_ends_at_once)
check the limits and translate_batch's own defaults, and a third of a tiny vocabulary whose
pieces tie exactly in pairs (tests/reference/marian_tiny_vocabulary) the order of equal scores.

``--full`` hunts for differences instead: CTranslate2 here, then onmt_lite (in the Python named
by ONMT_PYTHON, default python3, which runs this file with --compare) on the same lines, and a
table of what differs (see ``full``):

    ~/onmt-peers/bin/python tests/reference/make_ctranslate2.py --full

The model is converted with CTranslate2's own OpenNMT-py converter (the checkpoint's
argparse.Namespace allowed, its "scaled-dot-flash" attention named "scaled-dot", the only name
the converter accepts: the same attention). Each case translates the first LINES lines of the
lowercased, tokenized test_2016_flickr source with translate_batch and records every returned
hypothesis (tokens, without </s>) and its score; LINE_CASES translate a few chosen test lines,
each with its prefix or none, in batches of their own size.

``--full --only TEXT ...`` hunts only the settings whose name holds one of the strings.
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

import torch

try:  # the peers environment; the --compare half runs in onmt_lite's
    import ctranslate2
    from ctranslate2.converters import OpenNMTPyConverter, TransformersConverter
except ImportError:
    ctranslate2 = None

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
# cases on a few test lines of their own: (line number, with its prefix), in batches of
# max_batch_size: a batch whose lines have no prefix decodes as one without target_prefix (no
# </s> penalised at the first step), a line without one in a batch with prefixes does not;
# greedy search has no patience; length_penalty 0 ends on the top beam, whatever the patience
LINE_CASES = {
    "beam 6, length_penalty 0, 2 hypotheses, decoding length 0 to 40, batch 1": dict(
        lines=[(57, False), (83, False), (114, False), (214, False), (327, False),
               (371, False), (0, True), (2, True)],
        options=dict(beam_size=6, num_hypotheses=2, length_penalty=0.0, min_decoding_length=0,
                     max_decoding_length=40), batch=1),
    "beam 6, length_penalty 0, 2 hypotheses, decoding length 0 to 40, one batch": dict(
        lines=[(57, False), (83, False), (114, False), (214, False), (327, False),
               (371, False), (0, True), (2, True)],
        options=dict(beam_size=6, num_hypotheses=2, length_penalty=0.0, min_decoding_length=0,
                     max_decoding_length=40), batch=8),
    "greedy, length_penalty 2, patience 1.5, decoding length 8 to 40, repetition_penalty 1.2, "
    "no_repeat_ngram_size 2": dict(
        lines=[(19, False), (80, True), (83, True), (132, True), (0, True), (1, False)],
        options=dict(beam_size=1, length_penalty=2.0, patience=1.5, min_decoding_length=8,
                     max_decoding_length=40, repetition_penalty=1.2, no_repeat_ngram_size=2),
        batch=32),
}
# models that misbehave, written beside marian_tiny: one never ends by itself (every hypothesis
# meets the limit), one likes </s> at once; translate_batch's own defaults among the cases
EDGE_MODELS = {"never_ends": dict(seed=2, eos_bias=-30.0, max_position_embeddings=300),
               "ends_at_once": dict(seed=3, eos_bias=6.0, max_position_embeddings=300),
               # a vocabulary of 12 whose pieces tie exactly in pairs (marian_dirs.TWINS)
               "tiny_vocabulary": dict(seed=4, eos_bias=1.0, tiny_target=True,
                                       max_position_embeddings=300)}
EDGE_LINES = 12
EDGE_CASES = {
    "nothing given: translate_batch's defaults": dict(),
    "beam 2, translate_batch's defaults": dict(beam_size=2),
    "greedy, translate_batch's defaults": dict(beam_size=1),
    "beam 4, 4 hypotheses, decoding length 0 to 6": dict(
        beam_size=4, num_hypotheses=4, min_decoding_length=0, max_decoding_length=6),
    "beam 3, patience 2, length_penalty 0, decoding length 3 to 10": dict(
        beam_size=3, patience=2.0, length_penalty=0.0, min_decoding_length=3,
        max_decoding_length=10),
    "beam 8, 2 hypotheses, repetition_penalty 1.2, no_repeat_ngram_size 3, length 3 to 12": dict(
        beam_size=8, num_hypotheses=2, patience=2.0, repetition_penalty=1.2,
        no_repeat_ngram_size=3, min_decoding_length=3, max_decoding_length=12),
    "greedy, repetition_penalty 1.3, length 2 to 9": dict(
        beam_size=1, repetition_penalty=1.3, min_decoding_length=2, max_decoding_length=9),
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


def line_cases(translator):
    with open(SOURCE, encoding="utf-8") as f:
        source = f.read().split("\n")
    with open(TARGET, encoding="utf-8") as f:
        target = f.read().split("\n")
    out = {}
    for name, case in LINE_CASES.items():
        lines = [source[i] for i, _ in case["lines"]]
        prefixes = [target[i].split()[:2] if with_prefix else [] for i, with_prefix in case["lines"]]
        results = translator.translate_batch([line.split() for line in lines], prefixes,
                                             max_batch_size=case["batch"], return_scores=True,
                                             **case["options"])
        out[name] = {"options": case["options"], "batch": case["batch"], "lines": lines,
                     "prefixes": prefixes, "hypotheses": [
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


# -- the hunt (--full): translate_batch against -search ctranslate2, line by line --------------
TRAIN = os.path.join(SHARED, "data", "multi30k", "train")
HUNT_POSITIONS = 400  # the Marian models' position tables: room for the longest sources
# name -> write_marian arguments; "transformer": the OpenNMT-py fixture
HUNT_MODELS = {"transformer": None, "marian_tiny": dict(seed=6, eos_bias=3.0),
               "never_ends": dict(seed=2, eos_bias=-30.0),
               "ends_at_once": dict(seed=3, eos_bias=6.0),
               "tiny_vocabulary": dict(seed=4, eos_bias=1.0, tiny_target=True)}
TIE = 1e-5  # two candidates this close are a coin toss between two float32 implementations


def hunt_settings(count: int, prefixes: bool, seed: int = 0):
    """[(name, translate_batch options, batch size, with target prefixes)]: hand-picked edges
    (the first: translate_batch's defaults, nothing given), then settings drawn at random."""
    rng = random.Random(seed)
    picked = [dict(), dict(beam_size=1, max_decoding_length=1),
              dict(beam_size=3, min_decoding_length=0, max_decoding_length=2, num_hypotheses=3),
              dict(beam_size=12, num_hypotheses=6, length_penalty=2.0, patience=0.5),
              dict(beam_size=5, patience=2.0, length_penalty=0.0, num_hypotheses=2,
                   min_decoding_length=6, max_decoding_length=6),
              dict(beam_size=4, repetition_penalty=1.5, no_repeat_ngram_size=1,
                   max_decoding_length=12)]
    out = []
    for i in range(count):
        if i < len(picked):
            options = picked[i]
        else:
            beam = rng.choice([1, 2, 3, 4, 5, 6, 8, 12])
            options = dict(beam_size=beam,
                           num_hypotheses=rng.choice(sorted({1, 2, beam} & set(range(1, beam + 1)))),
                           length_penalty=rng.choice([0.0, 0.6, 1.0, 2.0]),
                           patience=rng.choice([1.0, 1.0, 2.0, 0.5, 1.5]))
            # translate_batch refuses more hypotheses than beam_size * patience
            options["num_hypotheses"] = max(1, min(options["num_hypotheses"],
                                                   int(beam * options["patience"])))
            longest, shortest = rng.choice([None, 1, 2, 5, 12, 20, 40]), rng.choice(
                [None, 0, 1, 3, 8, 12])
            if longest is not None:
                options["max_decoding_length"] = longest
            if shortest is not None:
                options["min_decoding_length"] = min(shortest, longest or shortest)
            for key, values in (("no_repeat_ngram_size", [0, 0, 2, 3]),
                                ("repetition_penalty", [1.0, 1.0, 1.2, 0.8])):
                value = rng.choice(values)
                if value not in (0, 1.0):
                    options[key] = value
        with_prefix = prefixes and i % 2 == 1
        batch = (1, 7, 64)[i % 3]
        name = ", ".join(f"{k} {v}" for k, v in options.items()) or "nothing given"
        out.append((name + f", batch {batch}" + ", target prefix" * with_prefix, options, batch,
                    with_prefix))
    return out


def _read(path: str):
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def hunt_lines(raw: bool, count: int, per_setting: int, test_lines: int, seed: int = 0):
    """Per setting: (lines, reference lines) -- the edges (an empty line, one-token lines, two
    lines longer than any of training), the next ``per_setting`` training lines, the same
    ``test_lines`` test lines. ``raw``: Multi30k's raw text, else lowercased and tokenized."""
    ext = "" if raw else ".lc.tok"
    train, train_de = _read(TRAIN + ext + ".en"), _read(TRAIN + ext + ".de")
    test, test_de = _read(SOURCE.replace(".lc.tok", ext)), _read(TARGET.replace(".lc.tok", ext))
    picks = random.Random(seed).sample(range(len(test)), min(test_lines, len(test)))
    longest = max(range(len(train)), key=lambda i: len(train[i]))
    edges = [("", ""), ("a", "ein"), ("dog", "hund"), (".", "."),
             (" ".join(train[longest:longest + 3]), " ".join(train_de[longest:longest + 3])),
             (" ".join(train[3:7]), " ".join(train_de[3:7]))]
    out = []
    for i in range(count):
        chunk = [(train[(i * per_setting + j) % len(train)], train_de[(i * per_setting + j)
                                                                      % len(train)])
                 for j in range(per_setting)]
        both = edges + chunk + [(test[j], test_de[j]) for j in picks]
        out.append(([a for a, _ in both], [b for _, b in both]))
    return out


def hunt(folder: str, count: int, per_setting: int, test_lines: int, names, only=None) -> dict:
    """CTranslate2's side of the hunt: every model x ``count`` settings (``only``: those whose
    name holds one of these strings)."""
    sys.path.insert(0, os.path.join(HERE, ".."))
    from marian_dirs import twin_pieces, write_marian
    from transformers import MarianTokenizer
    out = {"models": []}
    for name in names:
        converted = os.path.join(folder, name + ".ct2")
        marian = HUNT_MODELS[name] is not None
        if marian:
            model = write_marian(os.path.join(folder, name), max_position_embeddings=HUNT_POSITIONS,
                                 **HUNT_MODELS[name])
            TransformersConverter(model).convert(converted, force=True)
            tokenizer = MarianTokenizer.from_pretrained(model)
            encode = lambda line: tokenizer.convert_ids_to_tokens(tokenizer.encode(line))  # noqa
        else:
            model = MODEL
            convert(converted)
            encode = str.split
        translator = ctranslate2.Translator(converted, device="cpu", compute_type="float32",
                                            inter_threads=1, intra_threads=1)
        cases = []
        lines = hunt_lines(marian, count, per_setting, test_lines)
        for (setting, options, batch, with_prefix), (src, tgt) in zip(
                hunt_settings(count, not marian), lines):
            if only and not any(o in setting for o in only):
                continue
            prefixes = [t.split()[:2] if i % 3 != 1 else [] for i, t in enumerate(tgt)] \
                if with_prefix else None
            results = translator.translate_batch([encode(line) for line in src], prefixes,
                                                 max_batch_size=batch, return_scores=True,
                                                 **options)
            cases.append({"setting": setting, "options": options, "batch": batch, "lines": src,
                          "prefixes": prefixes, "hypotheses": [
                              [[" ".join(h), s] for h, s in zip(r.hypotheses, r.scores)]
                              for r in results]})
        out["models"].append({"name": name, "model": model, "marian": marian, "cases": cases,
                              "twins": twin_pieces(model) if marian else {}})
    return out


def classify(ours, theirs, twins=None):
    """'same', ('tie', rank, ours, theirs, detail) or ('differs', rank, detail) for one line's
    hypotheses [(tokens joined, score)]; ``twins``: pieces that tie exactly -> their twin."""
    sys.path.insert(0, os.path.join(HERE, ".."))
    from marian_dirs import twin_choice
    if len(ours) != len(theirs):
        return ("differs", -1, f"{len(ours)} hypotheses, CTranslate2 {len(theirs)}")
    for rank, ((tokens, score), (their_tokens, their_score)) in enumerate(zip(ours, theirs)):
        if tokens != their_tokens:
            alike = [[(twins or {}).get(t, t) for t in x.split()] for x in (tokens, their_tokens)]
            first = twin_choice(tokens.split(), their_tokens.split(), twins)
            if alike[0] == alike[1] or first or abs(score - their_score) <= TIE:
                kind = "twins" if alike[0] == alike[1] else "a twin first" if first else \
                    "other tokens"
                return ("tie", rank, score, their_score, f"{kind}: {tokens} vs {their_tokens}")
            return ("differs", rank, f"{tokens} ({score:.7f}) vs {their_tokens} "
                                     f"({their_score:.7f})")
        if abs(score - their_score) > max(1e-4, 2e-6 * abs(their_score)):
            return ("differs", rank, f"score {score:.7f} vs {their_score:.7f}")
    return "same"


def compare(path: str) -> int:
    """onmt_lite's side (its own environment): -search ctranslate2 on every case of the
    CTranslate2 results in ``path``; prints the table, returns the number of differences."""
    sys.path.insert(0, os.path.join(HERE, "..", ".."))
    sys.path.insert(0, os.path.join(HERE, ".."))
    from test_search_ctranslate2 import OPTIONS

    from onmt_lite.translate import build_translator
    torch.set_num_threads(1)
    with open(path, encoding="utf-8") as f:
        hunted = json.load(f)
    total = same = ties = differs = 0
    notes = []
    print(f"{'model':<16} {'setting':<150} {'lines':>5} {'same':>5} {'ties':>4} {'diff':>4}")
    for model in hunted["models"]:
        for case in model["cases"]:
            start = time.time()
            translator = build_translator({
                "model": model["model"], "search": "ctranslate2",
                "tgt_file_prefix": case["prefixes"] is not None,
                **{OPTIONS[k]: v for k, v in case["options"].items()}})
            prefixes = None if case["prefixes"] is None else [
                " ".join(p) for p in case["prefixes"]]
            results = translator.translate(case["lines"], prefixes, batch_size=case["batch"])
            found = []
            for line, result, theirs in zip(case["lines"], results, case["hypotheses"]):
                ours = [(" ".join(t for t in pred if t != "</s>" or not model["marian"]), score)
                        for pred, score in zip(result.preds, result.scores)]
                found.append((line, classify(ours, [tuple(h) for h in theirs], model["twins"])))
            s = sum(r == "same" for _, r in found)
            t = [(line, r) for line, r in found if r != "same" and r[0] == "tie"]
            d = [(line, r) for line, r in found if r != "same" and r[0] == "differs"]
            total, same, ties, differs = (total + len(found), same + s, ties + len(t),
                                          differs + len(d))
            print(f"{model['name']:<16} {case['setting']:<150} {len(found):>5} {s:>5} "
                  f"{len(t):>4} {len(d):>4}   {time.time() - start:.0f} s", flush=True)
            where = f"{model['name']} | {case['setting']}"
            notes += [f"TIE   {where} | {line[:60]!r}: rank {r[1]}, onmt_lite {r[2]:.9f}, "
                      f"CTranslate2 {r[3]:.9f}; {r[4]}" for line, r in t]
            notes += [f"DIFF  {where} | {line[:60]!r}: rank {r[1]}: {r[2]}" for line, r in d]
    print("\n".join(notes))
    print(f"\n{total} lines compared: {same} identical ({same / max(total, 1):.2%}), {ties} float "
          f"ties, {differs} unexplained differences")
    return differs


def full(args) -> int:
    """CTranslate2 here, then onmt_lite in its own Python (ONMT_PYTHON, default python3)."""
    with tempfile.TemporaryDirectory() as folder:
        hunted = hunt(folder, args.settings, args.lines, args.test_lines,
                      args.models or list(HUNT_MODELS), args.only)
        path = os.path.join(folder, "ctranslate2.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(hunted, f, ensure_ascii=False)
        python = os.environ.get("ONMT_PYTHON", "python3")
        return subprocess.run([python, os.path.abspath(__file__), "--compare", path]).returncode


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
        out["line_cases"] = line_cases(translator)
    with tempfile.TemporaryDirectory() as folder:
        out["marian_lines"], out["marian_cases"] = marian_cases(folder)
    with tempfile.TemporaryDirectory() as folder:
        out["edge_cases"] = edge_cases(folder)
    with open(os.path.join(HERE, "ctranslate2.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
        f.write("\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="CTranslate2's reference (the default), or the "
                                                 "hunt against onmt_lite (--full)")
    parser.add_argument("--full", action="store_true",
                        help="the hunt: every model x 40 settings x 170 lines, then a table")
    parser.add_argument("--settings", type=int, default=40, help="settings per model (--full)")
    parser.add_argument("--lines", type=int, default=120, help="training lines per setting")
    parser.add_argument("--test-lines", type=int, default=40, help="test lines per setting")
    parser.add_argument("--models", nargs="*", choices=list(HUNT_MODELS), help="default: all")
    parser.add_argument("--only", nargs="*", metavar="TEXT",
                        help="--full: only the settings whose name holds one of these strings "
                             "(the table's setting column)")
    parser.add_argument("--compare", help=argparse.SUPPRESS)  # the hunt's onmt_lite half
    arguments = parser.parse_args()
    if arguments.compare:
        sys.exit(1 if compare(arguments.compare) else 0)
    elif arguments.full:
        sys.exit(1 if full(arguments) else 0)
    else:
        main()
