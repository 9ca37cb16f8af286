"""``-search tf`` is the beam search of TensorFlow's official models: on the OpenNMT-py
Transformer fixture it keeps the hypotheses that search keeps, in the same order, with its
scores, beam-size many per line as TensorFlow returns them (finished slots that nothing filled
included, scored -1e7).

The reference (tests/reference/tensorflow.json) is that search's own output, run as it ships
(tf-models-official 2.20, tensorflow-cpu) by tests/reference/make_tensorflow.py in a side
environment, driving onmt_lite's model of the same weights (it proves the search rule, not the
model); the fixture is read from ../shared.
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


def translate(case: str):
    """onmt_lite's -search tf on the case's lines, as one batch as TensorFlow's: [(text, score)]
    per line, every hypothesis (-n_best is the beam size, as TensorFlow returns them all)."""
    options = CASES[case]["options"]
    with open(SOURCE, encoding="utf-8") as f:
        lines = [next(f).rstrip("\n") for _ in range(len(CASES[case]["hypotheses"]))]
    beam = options["beam_size"]
    translator = build_translator({"model": MODEL, "search": "tf", "beam_size": beam,
                                   "n_best": beam, "alpha": options["alpha"],
                                   "max_length": options["max_decode_length"]})
    results = translator.translate(lines, batch_size=len(lines))  # TensorFlow's one batch
    return [list(zip([" ".join(p) for p in r.preds], r.scores)) for r in results]


def filler(score: float) -> bool:
    """A finished slot that nothing filled: TensorFlow's score -INF (-1e7), its tokens the
    zeros it starts with (<unk> in this vocabulary); onmt_lite gives it the same score."""
    return score <= -TF_INF / 10


@pytest.mark.parametrize("case", list(CASES))
def test_tf_search_is_tensorflows(case):
    expected = CASES[case]["hypotheses"]
    results = translate(case)
    assert len(results) == len(expected)
    for number, (ours, theirs) in enumerate(zip(results, expected), 1):
        assert len(ours) == len(theirs) == CASES[case]["options"]["beam_size"], number
        assert [filler(s) for _, s in ours] == [filler(s) for _, s in theirs], number
        real = [(h, s) for h, s in theirs if not filler(s)]
        mine = [(h, s) for h, s in ours if not filler(s)]
        assert [h for h, _ in mine] == [h for h, _ in real], number
        assert [s for _, s in mine] == pytest.approx([s for _, s in real], abs=1e-4), number
        assert [s for _, s in ours if filler(s)] == [-TF_INF] * (len(ours) - len(mine)), number


# Where a sentence has fewer finished hypotheses than the beam, TensorFlow's finished slots keep
# their zeros: a candidate that did not end scores log-probability - 1e7, which float32 rounds
# to -1e7 when the log-probability is above about -0.5, a tie with the empty slots, and
# tf.nn.top_k puts the lower index (the slot already there) first; so must onmt_lite (torch.topk
# breaks ties either way: an unfinished prefix such as "zwei" would come back scored -1e7).
@pytest.mark.parametrize("case", CASES)
def test_tf_search_leaves_empty_slots_empty(case):
    """Slots that nothing finished in are returned empty, as TensorFlow returns them."""
    results = translate(case)
    for number, (ours, theirs) in enumerate(zip(results, CASES[case]["hypotheses"]), 1):
        empty = [h for h, s in theirs if filler(s)]
        assert [h for h, s in ours if filler(s)] == [""] * len(empty), number
