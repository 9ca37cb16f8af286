"""Makes tests/reference/onmt_py_hunt.json: OpenNMT-py 3.5.1's own n-best hypotheses and scores
over a sweep of its decoding settings, on its two fixtures and on the fixtures made to misbehave
(hunt_variant.py: never ends, ends at once, weights redrawn, exact ties in the generator), for
tests/test_onmt_py_hunt.py.

The lines are Multi30k training lines (train.lc.tok.en) and test lines (test_2016_flickr, val),
an empty line, one-token lines and lines longer than any training line (several joined); each
(setting, model) draws its own lines with a seeded generator. The settings sweep the beam size
(1 to 12), -n_best up to the beam, the length penalties (none, avg, wu; several alphas), the
coverage penalties (wu, summary; -beta, -stepwise_penalty), -min_length and -max_length near the
lines' lengths, -block_ngram_repeat 1 to 3 with -ignore_when_blocking, -ratio, -ban_unk_token,
-batch_size (1, 7, 64; -batch_type tokens) and -tgt (gold scores, and -tgt_file_prefix).

OpenNMT-py is not a dependency: run this with the peers virtualenv, from the repository root.
The default size writes the stored reference; ``--full`` decodes thousands of lines per setting
(about 1,000 lines a setting; under 30 minutes on two cores), writes them to a temporary
file and compares them with onmt_lite
at once (hunt_compare.py, run with onmt_lite's python: $ONMT_LITE_PYTHON, else ``python``),
printing a table:

    ~/onmt-peers/bin/python tests/reference/make_onmt_py_hunt.py
    ~/onmt-peers/bin/python tests/reference/make_onmt_py_hunt.py --full

OpenNMT-py runs in this process (its InferenceEnginePY, as onmt_translate runs it) so that the
scores keep every digit; it drops an empty line, which the comparison knows.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings

os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # OpenNMT-py 3.5.1's torch.load

import onmt  # noqa: E402
import torch  # noqa: E402
from hunt_lines import lines_for, read_corpora  # noqa: E402
from hunt_variant import KINDS, write_hunt_variant  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SHARED = os.path.join(ROOT, "..", "shared")
FIXTURES = os.path.join(SHARED, "fixtures", "onmt-py")
FIXTURE_NAMES = ("transformer", "rnn")
MODELS = [f"{fixture} {kind}" for fixture in FIXTURE_NAMES for kind in KINDS]
TRANSFORMERS = [m for m in MODELS if m.startswith("transformer")]
# (setting name, options, models): option names are onmt_translate's; "tgt" is "gold" (the
# reference as -tgt) or "prefix N" (its first N words as -tgt with -tgt_file_prefix). OpenNMT-py
# 3.5.1 crashes on an RNN with a coverage penalty, so those settings run the Transformers only.
SETTINGS = [
    ("greedy", {"beam_size": 1}, MODELS),
    ("greedy, batch 1", {"beam_size": 1, "batch_size": 1}, MODELS),
    ("beam 2", {"beam_size": 2}, MODELS),
    ("beam 5, 5 best", {"beam_size": 5, "n_best": 5}, MODELS),
    ("beam 12, 12 best, batch 7", {"beam_size": 12, "n_best": 12, "batch_size": 7}, MODELS),
    ("beam 8, 3 best, lp none", {"beam_size": 8, "n_best": 3, "length_penalty": "none"},
     MODELS),
    ("beam 4, wu 0.6, batch 64", {"beam_size": 4, "length_penalty": "wu", "alpha": 0.6,
                                  "batch_size": 64}, MODELS),
    ("beam 6, 2 best, wu 1.5", {"beam_size": 6, "n_best": 2, "length_penalty": "wu",
                                "alpha": 1.5}, MODELS),
    ("beam 5, 3 best, avg 0.3", {"beam_size": 5, "n_best": 3, "alpha": 0.3}, MODELS),
    ("beam 3, 3 best, avg 2", {"beam_size": 3, "n_best": 3, "alpha": 2.0}, MODELS),
    ("beam 7, 2 best, lp none, batch 1", {"beam_size": 7, "n_best": 2, "length_penalty": "none",
                                          "batch_size": 1}, MODELS),
    ("beam 5, 2 best, summary 0.3", {"beam_size": 5, "n_best": 2, "coverage_penalty": "summary",
                                     "beta": 0.3}, TRANSFORMERS),
    ("beam 4, 2 best, cov wu 0.2, batch 1", {"beam_size": 4, "n_best": 2,
                                             "coverage_penalty": "wu", "beta": 0.2,
                                             "batch_size": 1}, TRANSFORMERS),
    ("beam 5, summary 0.5 stepwise, wu 0.6", {"beam_size": 5, "coverage_penalty": "summary",
                                              "beta": 0.5, "stepwise_penalty": True,
                                              "length_penalty": "wu", "alpha": 0.6},
     TRANSFORMERS),
    ("beam 4, 3 best, cov wu 0.3 stepwise, batch 1", {
        "beam_size": 4, "n_best": 3, "coverage_penalty": "wu", "beta": 0.3,
        "stepwise_penalty": True, "batch_size": 1}, TRANSFORMERS),
    ("beam 5, 2 best, min 10", {"beam_size": 5, "n_best": 2, "min_length": 10}, MODELS),
    ("beam 5, 5 best, max 8", {"beam_size": 5, "n_best": 5, "max_length": 8}, MODELS),
    ("beam 4, 4 best, min 6, max 12, wu 0.6", {"beam_size": 4, "n_best": 4, "min_length": 6,
                                               "max_length": 12, "length_penalty": "wu",
                                               "alpha": 0.6}, MODELS),
    ("beam 3, min 30", {"beam_size": 3, "min_length": 30}, MODELS),
    ("beam 5, max 40, no length ratio", {"beam_size": 5, "max_length": 40,
                                         "max_length_ratio": 0}, MODELS),
    ("beam 5, block 1", {"beam_size": 5, "block_ngram_repeat": 1}, MODELS),
    ("beam 5, 3 best, block 2, batch 1", {"beam_size": 5, "n_best": 3, "block_ngram_repeat": 2,
                                          "batch_size": 1}, MODELS),
    ("beam 4, block 3 ignoring . and ein, batch 1", {
        "beam_size": 4, "block_ngram_repeat": 3, "ignore_when_blocking": [".", "ein"],
        "batch_size": 1}, MODELS),
    ("beam 5, block 2, batch 64", {"beam_size": 5, "block_ngram_repeat": 2, "batch_size": 64},
     MODELS),
    ("beam 5, 2 best, ratio 0.5, batch 7", {"beam_size": 5, "n_best": 2, "ratio": 0.5,
                                            "batch_size": 7}, MODELS),
    ("beam 6, 3 best, ratio 1.2", {"beam_size": 6, "n_best": 3, "ratio": 1.2}, MODELS),
    ("beam 5, 3 best, ban_unk_token", {"beam_size": 5, "n_best": 3, "ban_unk_token": True},
     MODELS),
    ("beam 5, batch 7", {"beam_size": 5, "batch_size": 7}, MODELS),
    ("beam 4, 2 best, 150 tokens", {"beam_size": 4, "n_best": 2, "batch_size": 150,
                                    "batch_type": "tokens"}, MODELS),
    ("beam 5, gold, 256 tokens", {"beam_size": 5, "tgt": "gold", "batch_size": 256,
                                  "batch_type": "tokens"}, MODELS),
    ("beam 5, 2 best, prefix 2", {"beam_size": 5, "n_best": 2, "tgt": "prefix 2"}, MODELS),
    ("beam 3, 3 best, prefix 3, max 6, 100 tokens", {
        "beam_size": 3, "n_best": 3, "tgt": "prefix 3", "max_length": 6, "batch_size": 100,
        "batch_type": "tokens"}, MODELS),
    ("greedy, prefix 1, min 4, batch 7", {"beam_size": 1, "tgt": "prefix 1", "min_length": 4,
                                          "batch_size": 7}, MODELS),
]
def targets(options: dict, tgt_lines):
    """The -tgt lines of a setting, or None."""
    kind = options.get("tgt")
    if kind is None:
        return None
    if kind == "gold":
        return tgt_lines
    words = int(kind.split()[1])
    return [" ".join(line.split()[:words]) for line in tgt_lines]


def onmt_translate_args(options: dict):
    args = []
    for key, value in options.items():
        if key == "tgt":
            if value.startswith("prefix"):
                args.append("-tgt_file_prefix")
        elif value is True:
            args.append(f"-{key}")
        elif isinstance(value, list):
            args += [f"-{key}", *value]
        else:
            args += [f"-{key}", str(value)]
    return args


def run_onmt_py(model: str, src_lines, tgt_lines, options: dict, work: str):
    """OpenNMT-py's n-best lists [[(hypothesis, score), ...], ...] for the non-empty lines."""
    from onmt.bin.translate import _get_parser
    from onmt.inference_engine import InferenceEnginePY
    from onmt.utils.parse import ArgumentParser
    src = os.path.join(work, "src.en")
    with open(src, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in src_lines)
    argv = ["-model", model, "-src", src, "-output", os.path.join(work, "pred.txt"),
            "-gpu", "-1", *onmt_translate_args(options)]
    if tgt_lines is not None:
        tgt = os.path.join(work, "tgt.de")
        with open(tgt, "w", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in tgt_lines)
        argv += ["-tgt", tgt]
    opt = _get_parser().parse_args(argv)
    ArgumentParser.validate_translate_opts(opt)
    ArgumentParser._get_all_transform_translate(opt)
    ArgumentParser._validate_transforms_opts(opt)
    ArgumentParser.validate_translate_opts_dynamic(opt)
    engine = InferenceEnginePY(opt)
    scores, preds = engine.infer_file()
    engine.terminate()
    return [[[p, float(s)] for p, s in zip(nbest, nbest_scores)]
            for nbest, nbest_scores in zip(preds, scores)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="thousands of lines per setting, "
                        "compared with onmt_lite at once")
    parser.add_argument("--out", help="where to write the reference (default: the stored "
                        "one, or with --full a temporary file)")
    parser.add_argument("--settings", help="only the settings whose names contain this")
    parser.add_argument("--models", help="only the models whose names contain this")
    args = parser.parse_args()
    size = "full" if args.full else "default"
    warnings.filterwarnings("ignore")
    import logging
    logging.disable(logging.WARNING)
    corpora = read_corpora()
    out = {"made_by": "tests/reference/make_onmt_py_hunt.py", "opennmt-py": onmt.__version__,
           "torch": torch.__version__, "size": size, "digests": {}, "cases": []}
    started = time.time()
    with tempfile.TemporaryDirectory() as work:
        paths = {}
        for fixture in FIXTURE_NAMES:
            for kind in KINDS:
                name = f"{fixture} {kind}"
                paths[name] = os.path.join(work, f"{fixture}-{kind.replace(' ', '-')}.pt")
                out["digests"][name] = write_hunt_variant(
                    os.path.join(FIXTURES, f"{fixture}.pt"), paths[name], kind)
        for name, options, models in SETTINGS:
            if args.settings and args.settings not in name:
                continue
            for model in models:
                if args.models and args.models not in model:
                    continue
                pairs = lines_for(name, model, size, corpora)
                src_lines = [s for s, _ in pairs]
                tgt_lines = targets(options, [t for _, t in pairs])
                t0 = time.time()
                nbest = run_onmt_py(paths[model], src_lines, tgt_lines, options, work)
                out["cases"].append({"setting": name, "model": model, "options": options,
                                     "src": src_lines, "tgt": tgt_lines, "nbest": nbest})
                print(f"{time.time() - started:7.1f}s {name} | {model}: {len(src_lines)} lines "
                      f"in {time.time() - t0:.1f}s", file=sys.stderr, flush=True)
    path = args.out or (os.path.join(tempfile.gettempdir(), "onmt_py_hunt_full.json")
                        if args.full else os.path.join(HERE, "onmt_py_hunt.json"))
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path}", file=sys.stderr)
    if args.full:
        python = os.environ.get("ONMT_LITE_PYTHON", "python")
        subprocess.run([python, os.path.join(HERE, "hunt_compare.py"), path], check=True,
                       cwd=ROOT)


if __name__ == "__main__":
    main()
