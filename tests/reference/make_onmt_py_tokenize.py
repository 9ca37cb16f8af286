"""Makes tests/reference/onmt_py_tokenize.json: OpenNMT-py 3.5.1's own onmt_tokenize transform
and onmt_translate on the raw-text fixture (../shared/fixtures/onmt-py-spm/model.pt), beam 5,
the first LINES lines of test_2016_flickr.en as one batch, for test_transforms.py.

Each case names onmt_tokenize with sentencepiece (the fixture's spm.model) on both sides and
its own -src_onmttok_kwargs / -tgt_onmttok_kwargs. For each, the file holds the pieces that
OpenNMT-py's ONMTTokenizerTransform makes of each source line (the transform called directly,
built by OpenNMT-py's own option parser), and from onmt_translate -verbose: the source pieces
as the model sees them (SENT, <unk> for a piece outside the vocabulary), the hypothesis pieces
(PRED), their score (PRED SCORE, 4 decimals), and the line written to -output (the target
pieces detokenized by the transform).

OpenNMT-py is not a dependency: run this with the peers virtualenv
(../shared/peers/setup-peers.sh), from the repository root:

    ~/onmt-peers/bin/python tests/reference/make_onmt_py_tokenize.py

OpenNMT-py 3.5.1 loads checkpoints with torch.load's old default, so onmt_translate runs with
TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 (as the fixture's MANIFEST describes).
"""
import ast
import json
import os
import re
import subprocess
import sys
import tempfile

import onmt
import pyonmttok
import sentencepiece
import torch
from onmt.opts import translate_opts
from onmt.transforms import get_transforms_cls, make_transforms
from onmt.utils.parse import ArgumentParser

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.path.join(HERE, "..", "..", "..", "shared")
FIXTURE = os.path.join(SHARED, "fixtures", "onmt-py-spm")
SOURCE = os.path.join(SHARED, "data", "multi30k", "test_2016_flickr.en")
LINES = 3
SPM = os.path.join(FIXTURE, "spm.model")
AGGRESSIVE = "{'mode': 'aggressive', 'joiner_annotate': True}"
CONSERVATIVE = "{'mode': 'conservative', 'joiner_annotate': True}"
# name -> (-src_onmttok_kwargs, -tgt_onmttok_kwargs)
CASES = {
    "mode none on both sides": ("{'mode': 'none'}", "{'mode': 'none'}"),
    "conservative source, aggressive target": (CONSERVATIVE, AGGRESSIVE),
}


def transform_options(src_kwargs: str, tgt_kwargs: str) -> list:
    return ["-transforms", "onmt_tokenize",
            "-src_subword_type", "sentencepiece", "-src_subword_model", SPM,
            "-tgt_subword_type", "sentencepiece", "-tgt_subword_model", SPM,
            "-src_onmttok_kwargs", src_kwargs, "-tgt_onmttok_kwargs", tgt_kwargs]


def source_pieces(options: list, lines: list) -> list:
    """OpenNMT-py's onmt_tokenize transform, set up as onmt_translate sets it up, on each
    source line as onmt_translate reads it (split on single spaces)."""
    parser = ArgumentParser()
    translate_opts(parser)
    opt = parser.parse_args(["-model", os.path.join(FIXTURE, "model.pt"), "-src", SOURCE,
                             *options])
    ArgumentParser.validate_translate_opts(opt)
    ArgumentParser._get_all_transform_translate(opt)
    ArgumentParser._validate_transforms_opts(opt)
    ArgumentParser.validate_translate_opts_dynamic(opt)
    transform = make_transforms(opt, get_transforms_cls(opt._all_transform), None)
    tokenize = transform["onmt_tokenize"]
    return [tokenize.apply({"src": line.strip().split(" "), "tgt": None})["src"]
            for line in lines]


def main() -> None:
    with open(SOURCE, encoding="utf-8") as f:
        lines = [next(f).rstrip("\n") for _ in range(LINES)]
    out = {"made_by": "tests/reference/make_onmt_py_tokenize.py", "opennmt-py": onmt.__version__,
           "pyonmttok": pyonmttok.__version__, "sentencepiece": sentencepiece.__version__,
           "torch": torch.__version__, "model": "../shared/fixtures/onmt-py-spm/model.pt",
           "subword_model": "../shared/fixtures/onmt-py-spm/spm.model",
           "source": f"first {LINES} lines of test_2016_flickr.en", "beam_size": 5,
           "cases": {}}
    translate = os.path.join(os.path.dirname(sys.executable), "onmt_translate")
    env = dict(os.environ, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1", OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as work:
        src, pred = os.path.join(work, "src.en"), os.path.join(work, "pred.de")
        with open(src, "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
        for name, (src_kwargs, tgt_kwargs) in CASES.items():
            options = transform_options(src_kwargs, tgt_kwargs)
            run = subprocess.run([translate, "-model", os.path.join(FIXTURE, "model.pt"),
                                  "-src", src, "-output", pred, "-gpu", "-1", "-beam_size", "5",
                                  "-verbose", *options],
                                 env=env, check=True, capture_output=True, text=True)
            log = run.stdout + run.stderr
            with open(pred, encoding="utf-8") as f:
                written = f.read().split("\n")[:-1]
            out["cases"][name] = {
                "src_onmttok_kwargs": ast.literal_eval(src_kwargs),
                "tgt_onmttok_kwargs": ast.literal_eval(tgt_kwargs),
                "source_pieces": source_pieces(options, lines),
                "sent": [ast.literal_eval(s) for s in re.findall(r"^SENT \d+: (\[.*\])$", log,
                                                                  re.M)],
                "pred": re.findall(r"^PRED \d+: (.*)$", log, re.M),
                "pred_score": [float(s) for s in re.findall(r"^PRED SCORE: (\S+)$", log, re.M)],
                "output": written,
            }
            assert all(len(out["cases"][name][key]) == LINES for key in (
                "source_pieces", "sent", "pred", "pred_score", "output")), (name, log)
    with open(os.path.join(HERE, "onmt_py_tokenize.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
