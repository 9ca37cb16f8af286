"""``-search fairseq`` is fairseq's SequenceGenerator: the OpenNMT-py Transformer fixture gives
the hypotheses that fairseq 0.12.2 gives on it, in the same order, with its scores, with its
BeamSearch and with its DiverseBeamSearch (``-diverse_groups``, ``-diverse_strength``).

The reference (tests/reference/fairseq.json) is fairseq's own search driving onmt_lite's model
of the same weights (it proves the search rule, not the model), made by
tests/reference/make_fairseq.py in a side environment; the fixture is read from ../shared; the
tests of the finishing rules and of the options need none of it.
"""
import json
import os

import pytest
import torch
from conftest import ROOT, SHARED_FIXTURES, tiny_checkpoint

from onmt_lite.checkpoint import load_checkpoint
from onmt_lite.search.finishing import DiverseGroups, FirstFinished
from onmt_lite.translate import build_translator

MODEL = os.path.join(SHARED_FIXTURES, "transformer.pt")
SOURCE = os.path.join(ROOT, "..", "shared", "data", "multi30k", "test_2016_flickr.lc.tok.en")
REFERENCE = os.path.join(ROOT, "tests", "reference", "fairseq.json")
with open(REFERENCE, encoding="utf-8") as f:
    REF = json.load(f)
# SequenceGenerator argument -> onmt_lite option
OPTIONS = dict(beam_size="beam_size", nbest="n_best", len_penalty="alpha",
               min_len="min_length", max_len_b="max_length",
               no_repeat_ngram_size="block_ngram_repeat")


# SequenceGenerator's defaults where onmt_lite's differ (min_len 1: no empty output)
DEFAULTS = dict(alpha=1.0, min_length=1)


def options_of(case: dict) -> dict:
    options = {**DEFAULTS, **{OPTIONS[k]: v for k, v in case["options"].items() if k in OPTIONS}}
    if case["options"]["diverse"]:
        options["diverse_groups"], options["diverse_strength"] = case["options"]["diverse"]
    return options


@pytest.mark.skipif(not (os.path.exists(MODEL) and os.path.exists(SOURCE)),
                    reason="needs ../shared (the OpenNMT-py fixture, Multi30k)")
@pytest.mark.parametrize("case", list(REF["cases"]))
def test_fairseq_search_is_fairseqs(case):
    with open(SOURCE, encoding="utf-8") as f:
        lines = [next(f).rstrip("\n") for _ in range(150)]
    translator = build_translator({"model": MODEL, "search": "fairseq",
                                   **options_of(REF["cases"][case])})
    results = translator.translate(lines, batch_size=32)
    expected = REF["cases"][case]["hypotheses"]
    assert len(results) == len(expected)
    for number, (result, theirs) in enumerate(zip(results, expected), 1):
        assert [" ".join(p) for p in result.preds] == [h for h, _ in theirs], number
        assert result.scores == pytest.approx([s for _, s in theirs], abs=1e-4), number


def test_finished_hypotheses_are_kept_in_candidate_order_up_to_the_beam_size():
    """Unlike Hugging Face's list of the k best, fairseq keeps the first k finalized: a
    better one that ends later does not replace them; the sentence is done at k."""
    eos = 3
    rule = FirstFinished(eos=eos, max_length=10, n_best=2, alpha=0.0)
    rule.start(1, 2, torch.zeros(2, 4, dtype=torch.bool))
    path = lambda c: (torch.tensor([c, eos]), torch.zeros(2, 4))  # noqa: E731
    # step 1: one of the first two candidates ends; the first two that did not end run on
    values, tokens = torch.tensor([[-1.0, -2.0, -3.0, -4.0]]), torch.tensor([[5, eos, 6, 7]])
    going_on, done = rule.advance(values, None, tokens, 1, None, path)
    assert going_on.tolist() == [[0, 2]] and not done
    assert rule.running.tolist() == [[-1.0, -3.0]]
    # step 2: both of the first two end: only one more fits, the better one; done
    values, tokens = torch.tensor([[-1.5, -2.5, -9.0, -9.5]]), torch.tensor([[eos, eos, 6, 7]])
    _, done = rule.advance(values, None, tokens, 2, None, path)
    assert [h.score for h in done[0]] == [-1.5, -2.0]


def test_diverse_groups_pay_for_the_tokens_earlier_groups_chose():
    """Two groups of one hypothesis over three tokens: group 1 pays the strength for the
    tokens group 0's two candidates took, and the candidates interleave by group."""
    rule = DiverseGroups(eos=0, max_length=10, n_best=1, groups=2, strength=1.0)
    rule.start(1, 2, torch.zeros(2, 3, dtype=torch.bool))
    log_probs = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.5, 0.3, 0.2]])).view(1, 2, 3)
    rule.rank(log_probs.view(2, 3), 1, None)  # the first step: each group extends its first
    values, ids = rule.pick(log_probs, 2)
    # group 0 takes tokens 0 and 1 of row 0; group 1 pays 1 for those: 2 (0.2), then 0
    assert ids.tolist() == [[0, 5, 1, 3]]
    expected = torch.log(torch.tensor([0.5, 0.2, 0.3, 0.5])) - torch.tensor([0, 0, 0, 1.0])
    assert values[0].tolist() == pytest.approx(expected.tolist())


def test_diverse_groups_must_divide_the_beam_and_need_the_fairseq_preset(tmp_path):
    model = tiny_checkpoint(tmp_path / "tiny.pt")  # any model: the options are refused
    with pytest.raises(ValueError, match="^-diverse_groups 2 must divide -beam_size 5$"):
        build_translator({"model": model, "search": "fairseq", "beam_size": 5,
                          "diverse_groups": 2})
    with pytest.raises(ValueError, match="^-diverse_groups: diverse beam search is fairseq's: "
                                         "give -search fairseq$"):
        build_translator({"model": model, "beam_size": 4, "diverse_groups": 2})
    assert build_translator({"model": model, "search": "fairseq", "beam_size": 4,
                             "diverse_groups": 2}).opt.diverse_groups == 2


def test_the_preset_takes_sequence_generators_length_defaults(tmp_path):
    """With no -max_length or -min_length, -search fairseq decodes up to 200 tokens (max_len_b,
    then </s> is the only choice) and never ends before the first (min_len 1), as
    SequenceGenerator does; options given still win."""
    ckpt = tiny_checkpoint(tmp_path / "m.pt")
    model = load_checkpoint(ckpt)
    eos = model.tgt_vocab.stoi["</s>"]
    for name, shift in (("never.pt", -1e4), ("first.pt", 1e4)):
        bias = model.generator_state["bias"].clone().index_fill_(0, torch.tensor([eos]), shift)
        torch.save(dict(torch.load(ckpt, weights_only=True),
                        generator=dict(model.generator_state, bias=bias)), tmp_path / name)
    never_ends = build_translator({"model": str(tmp_path / "never.pt"), "search": "fairseq",
                                   "beam_size": 2})
    assert (never_ends.opt.max_length, never_ends.opt.min_length) == (200, 1)
    assert [len(t.preds[0]) for t in never_ends.translate(["a b", "c"])] == [200, 200]
    ends_first = build_translator({"model": str(tmp_path / "first.pt"), "search": "fairseq",
                                   "beam_size": 2})
    assert [len(t.preds[0]) for t in ends_first.translate(["a b"])] == [1]
    given = build_translator({"model": str(tmp_path / "never.pt"), "search": "fairseq",
                              "beam_size": 2, "max_length": 7, "min_length": 0})
    assert (given.opt.max_length, given.opt.min_length) == (7, 0)
