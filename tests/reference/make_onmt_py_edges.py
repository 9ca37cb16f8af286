"""Makes tests/reference/onmt_py_edges.json: OpenNMT-py 3.5.1's own outputs on its two fixtures
made to misbehave, for test_search_onmt_features.py. Each fixture's generator bias of </s> is
moved (edge_variant.py): by -30, so that no hypothesis ends by itself and every one meets the
length limit, and by +12, so that </s> is likeliest from the first step. Six settings each
(greedy, beam 3 to 5, -n_best up to 5, -max_length 12, -min_length 5 with the wu penalty,
-block_ngram_repeat 2) on the first LINES lines of test_2016_flickr. OpenNMT-py is not a
dependency: run this with the peers virtualenv (../shared/peers/setup-peers.sh), from the
repository root:

    ~/onmt-peers/bin/python tests/reference/make_onmt_py_edges.py
"""
import json
import os
import subprocess
import sys
import tempfile

import onmt
import torch
from edge_variant import EOS_SHIFTS, write_edge_variant

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.path.join(HERE, "..", "..", "..", "shared")
FIXTURES = os.path.join(SHARED, "fixtures", "onmt-py")
SOURCE = os.path.join(SHARED, "data", "multi30k", "test_2016_flickr.lc.tok.en")
LINES = 40
CASES = {  # name -> onmt_translate options
    "beam 5": ["-beam_size", "5"],
    "beam 5, 5 best": ["-beam_size", "5", "-n_best", "5"],
    "greedy": ["-beam_size", "1"],
    "beam 3, 3 best, 12 tokens at most": ["-beam_size", "3", "-max_length", "12", "-n_best", "3"],
    "beam 4, 2 best, 5 words at least, wu 0.6": [
        "-beam_size", "4", "-min_length", "5", "-length_penalty", "wu", "-alpha", "0.6",
        "-n_best", "2"],
    "beam 5, block_ngram_repeat 2": ["-beam_size", "5", "-block_ngram_repeat", "2"],
}


def main() -> None:
    out = {"made_by": "tests/reference/make_onmt_py_edges.py", "opennmt-py": onmt.__version__,
           "torch": torch.__version__, "lines": LINES, "cases": CASES, "outputs": {}}
    translate = os.path.join(os.path.dirname(sys.executable), "onmt_translate")
    env = dict(os.environ, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1")
    with tempfile.TemporaryDirectory() as work:
        src = os.path.join(work, "src.en")
        with open(SOURCE, encoding="utf-8") as f, open(src, "w", encoding="utf-8") as w:
            w.writelines(next(f) for _ in range(LINES))
        for fixture in ("transformer.pt", "rnn.pt"):
            for shift in EOS_SHIFTS:
                model = os.path.join(work, f"{shift}-{fixture}")
                write_edge_variant(os.path.join(FIXTURES, fixture), model, shift)
                for name, options in CASES.items():
                    pred = os.path.join(work, "pred.txt")
                    subprocess.run([translate, "-model", model, "-src", src, "-output", pred,
                                    "-gpu", "-1", *options], env=env, check=True,
                                   capture_output=True)
                    with open(pred, encoding="utf-8") as f:
                        out["outputs"][f"{fixture} {shift}, {name}"] = f.read().splitlines()
    with open(os.path.join(HERE, "onmt_py_edges.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
        f.write("\n")


if __name__ == "__main__":
    main()
