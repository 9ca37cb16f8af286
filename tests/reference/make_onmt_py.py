"""Makes tests/reference/onmt_py.json: OpenNMT-py 3.5.1's own outputs for the decoding features
that the shared fixtures do not cover (-ban_unk_token, -ratio, -tgt_file_prefix, ensembles), on
the first LINES lines of test_2016_flickr, for test_search_onmt_features.py. The ensembles join
the Transformer fixture and a variant of it (onmt_py_variant.py): OpenNMT-py 3.5.1 cannot
ensemble a Transformer with an RNN (its attention shapes differ; it crashes). OpenNMT-py is not a
dependency: run this with the peers virtualenv (../shared/peers/setup-peers.sh), from the
repository root:

    ~/onmt-peers/bin/python tests/reference/make_onmt_py.py

OpenNMT-py 3.5.1 loads checkpoints with torch.load's old default, so it runs with
TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 (as the fixture's MANIFEST describes). The -tgt_file_prefix
case forces the first three words of each reference.
"""
import json
import os
import subprocess
import sys
import tempfile

import onmt
import torch
from onmt_py_variant import write_variant

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.path.join(HERE, "..", "..", "..", "shared")
FIXTURES = os.path.join(SHARED, "fixtures", "onmt-py")
DATA = os.path.join(SHARED, "data", "multi30k")
LINES = 100
PREFIX_WORDS = 3
# name -> (models, onmt_translate options)
CASES = {
    "ban_unk_token, 2 best": (["transformer.pt"], ["-ban_unk_token", "-n_best", "2"]),
    "ratio 0.9, 2 best": (["transformer.pt"], ["-ratio", "0.9", "-n_best", "2"]),
    "tgt_file_prefix": (["transformer.pt"], ["-tgt_file_prefix"]),
    "ensemble": (["transformer.pt", "variant.pt"], []),
    "ensemble, avg_raw_probs, 2 best": (["transformer.pt", "variant.pt"],
                                        ["-avg_raw_probs", "-n_best", "2"]),
}


def main() -> None:
    out = {"made_by": "tests/reference/make_onmt_py.py", "opennmt-py": onmt.__version__,
           "torch": torch.__version__, "lines": LINES, "prefix_words": PREFIX_WORDS,
           "cases": {}}
    translate = os.path.join(os.path.dirname(sys.executable), "onmt_translate")
    env = dict(os.environ, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1")
    with tempfile.TemporaryDirectory() as work:
        write_variant(os.path.join(FIXTURES, "transformer.pt"), os.path.join(work, "variant.pt"))
        src, tgt = os.path.join(work, "src.en"), os.path.join(work, "prefix.de")
        for path, name, words in ((src, "test_2016_flickr.lc.tok.en", None),
                                  (tgt, "test_2016_flickr.lc.tok.de", PREFIX_WORDS)):
            with open(os.path.join(DATA, name), encoding="utf-8") as f, \
                    open(path, "w", encoding="utf-8") as w:
                for _ in range(LINES):
                    w.write(" ".join(next(f).split()[:words]) + "\n")
        for name, (models, options) in CASES.items():
            pred = os.path.join(work, "pred.txt")
            extra = ["-tgt", tgt] if "-tgt_file_prefix" in options else []
            paths = [os.path.join(work if m == "variant.pt" else FIXTURES, m) for m in models]
            subprocess.run([translate, "-model", *paths,
                            "-src", src, "-output", pred, "-beam_size", "5", *extra, *options],
                           env=env, check=True, capture_output=True)
            with open(pred, encoding="utf-8") as f:
                out["cases"][name] = {"models": models, "options": options,
                                      "output": f.read().splitlines()}
    with open(os.path.join(HERE, "onmt_py.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
        f.write("\n")


if __name__ == "__main__":
    main()
