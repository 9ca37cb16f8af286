"""``-search tf`` is the beam search of TensorFlow's official models: on the OpenNMT-py
Transformer fixture it keeps the hypotheses that search keeps, in the same order, with its
scores.

The reference (tests/reference/tensorflow.json) is that search's own output, run as it ships
(tf-models-official 2.20, tensorflow-cpu) by tests/reference/make_tensorflow.py in a side
environment, driving onmt_lite's model of the same weights; the fixture is read from ../shared.
"""
import json
import os

import pytest
from conftest import ROOT, SHARED_FIXTURES

from onmt_lite.search.finishing import TF_INF
from onmt_lite.translate import build_translator

MODEL = os.path.join(SHARED_FIXTURES, "transformer.pt")
SOURCE = os.path.join(ROOT, "..", "shared", "data", "multi30k", "test_2016_flickr.lc.tok.en")
REFERENCE = os.path.join(ROOT, "tests", "reference", "tensorflow.json")
pytestmark = pytest.mark.skipif(not (os.path.exists(MODEL) and os.path.exists(SOURCE)),
                                reason="needs ../shared (the OpenNMT-py fixture, Multi30k)")

with open(REFERENCE, encoding="utf-8") as f:
    CASES = json.load(f)["cases"]


@pytest.mark.parametrize("case", list(CASES))
def test_tf_search_is_tensorflows(case):
    options = CASES[case]["options"]
    expected = CASES[case]["hypotheses"]
    with open(SOURCE, encoding="utf-8") as f:
        lines = [next(f).rstrip("\n") for _ in range(len(expected))]
    beam = options["beam_size"]
    translator = build_translator({"model": MODEL, "search": "tf", "beam_size": beam,
                                   "n_best": beam, "alpha": options["alpha"],
                                   "max_length": options["max_decode_length"]})
    results = translator.translate(lines, batch_size=len(lines))  # TensorFlow's one batch
    for number, (result, theirs) in enumerate(zip(results, expected), 1):
        real = [(h, s) for h, s in theirs if s > -TF_INF / 10]  # not TensorFlow's fillers
        ours = list(zip([" ".join(p) for p in result.preds], result.scores))[:len(real)]
        assert [h for h, _ in ours] == [h for h, _ in real], number
        assert [s for _, s in ours] == pytest.approx([s for _, s in real], abs=1e-4), number
