"""``-search ctranslate2`` is CTranslate2's beam search: the OpenNMT-py Transformer fixture
gives the hypotheses that CTranslate2 4.8.5 gives on it, in the same order, with its scores.

The reference (tests/reference/ctranslate2.json) is CTranslate2's own output, made by
tests/reference/make_ctranslate2.py in a side environment; the fixture is read from ../shared.
"""
import json
import os

import pytest
import torch
from conftest import ROOT, SHARED_FIXTURES

from onmt_lite.search.finishing import ReplaceFinished
from onmt_lite.translate import build_translator

MODEL = os.path.join(SHARED_FIXTURES, "transformer.pt")
SOURCE = os.path.join(ROOT, "..", "shared", "data", "multi30k", "test_2016_flickr.lc.tok.en")
REFERENCE = os.path.join(ROOT, "tests", "reference", "ctranslate2.json")
pytestmark = pytest.mark.skipif(not (os.path.exists(MODEL) and os.path.exists(SOURCE)),
                                reason="needs ../shared (the OpenNMT-py fixture, Multi30k)")
# translate_batch argument -> onmt_lite option
OPTIONS = dict(beam_size="beam_size", num_hypotheses="n_best", length_penalty="alpha",
               patience="patience", min_decoding_length="min_length",
               max_decoding_length="max_length", repetition_penalty="repetition_penalty",
               no_repeat_ngram_size="block_ngram_repeat")
# CTranslate2's defaults where onmt_lite's differ
DEFAULTS = dict(alpha=1.0, max_length=256)
# CTranslate2 scores a hypothesis in its beam search up to 8e-4 apart from its own score_batch
# on the same tokens (line 15, "drei personen sitzen in einer <unk> .": -1.75382 against
# -1.75464, which onmt_lite gives for both): its incremental decoder's rounding
SCORE_TOLERANCE = 1e-3

with open(REFERENCE, encoding="utf-8") as f:
    CASES = json.load(f)["cases"]


@pytest.fixture(scope="module")
def lines():
    with open(SOURCE, encoding="utf-8") as f:
        return [next(f).rstrip("\n") for _ in range(150)]


@pytest.mark.parametrize("case", list(CASES))
def test_ctranslate2_search_is_ctranslate2s(case, lines):
    options = {**DEFAULTS, **{OPTIONS[k]: v for k, v in CASES[case]["options"].items()}}
    translator = build_translator({"model": MODEL, "search": "ctranslate2", **options})
    results = translator.translate(lines, batch_size=32)
    expected = CASES[case]["hypotheses"]
    assert len(results) == len(expected)
    for number, (result, theirs) in enumerate(zip(results, expected), 1):
        assert [" ".join(p) for p in result.preds] == [h for h, _ in theirs], number
        assert result.scores == pytest.approx([s for _, s in theirs], abs=SCORE_TOLERANCE), number


def test_a_first_step_end_after_the_best_candidate_is_a_dead_end():
    """CTranslate2 turns a first-step </s> other than the best candidate into token 0 with
    score -1e10 on the first hypothesis, so no empty hypothesis is recorded from it (case
    "beam 6, length_penalty 2" line 115 has one otherwise)."""
    rule = ReplaceFinished(eos=3, max_length=10, n_best=1)
    values = torch.tensor([[-0.1, -0.5, -0.7, -0.9]])
    origin, tokens = torch.tensor([[0, 0, 0, 0]]), torch.tensor([[3, 5, 3, 6]])
    revised = rule.revise(values, origin, tokens, step=1)
    assert revised[0][0].tolist() == pytest.approx([-0.1, -0.5, -1e10, -0.9])
    assert revised[2].tolist() == [[3, 5, 0, 6]]
    later = rule.revise(values, origin, tokens, step=2)
    assert later[2].tolist() == [[3, 5, 3, 6]] and torch.equal(later[0], values)
