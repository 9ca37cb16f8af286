"""``-search ctranslate2`` is CTranslate2's beam search: the OpenNMT-py Transformer fixture
(converted by CTranslate2's OpenNMT-py converter) and a tiny Marian model (by its Transformers
converter) give the hypotheses that CTranslate2 4.8.5 gives on them, in the same order, with
its scores; with target prefixes too.

The reference (tests/reference/ctranslate2.json) is CTranslate2's own output, made by
tests/reference/make_ctranslate2.py in a side environment; the fixture is read from ../shared,
the Marian model from tests/reference/marian_tiny.
"""
import json
import os

import pytest
import torch
from conftest import ROOT, SHARED_FIXTURES, tiny_checkpoint
from marian_dirs import twin_pieces

from onmt_lite.checkpoint import load_checkpoint
from onmt_lite.search.finishing import ReplaceFinished
from onmt_lite.translate import build_translator

MODEL = os.path.join(SHARED_FIXTURES, "transformer.pt")
SOURCE = os.path.join(ROOT, "..", "shared", "data", "multi30k", "test_2016_flickr.lc.tok.en")
REFERENCE = os.path.join(ROOT, "tests", "reference", "ctranslate2.json")
MARIAN = os.path.join(ROOT, "tests", "reference", "marian_tiny")
needs_shared = pytest.mark.skipif(not (os.path.exists(MODEL) and os.path.exists(SOURCE)),
                                  reason="needs ../shared (the OpenNMT-py fixture, Multi30k)")
# translate_batch argument -> onmt_lite option
OPTIONS = dict(beam_size="beam_size", num_hypotheses="n_best", length_penalty="alpha",
               patience="patience", min_decoding_length="min_length",
               max_decoding_length="max_length", repetition_penalty="repetition_penalty",
               no_repeat_ngram_size="block_ngram_repeat")
# translate_batch's defaults where onmt_lite's differ (min_decoding_length 1: no empty output)
DEFAULTS = dict(alpha=1.0, max_length=256, min_length=1)
SCORE_TOLERANCE = 1e-4  # or float32's rounding of long sums (rel 2e-6, at -107: 1.3e-4)

with open(REFERENCE, encoding="utf-8") as f:
    REF = json.load(f)
# (model, case) -> line numbers where CTranslate2 and onmt_lite keep different ones of exactly
# equal candidates: the tiny vocabulary's twin pieces (equal embeddings and bias) tie, and
# CTranslate2's TopK orders equal scores by std::partial_sort's heap (src/ops/topk_cpu.cc),
# torch.topk by its own; the hypotheses are the same but for twins (checked), and what a
# penalty that counts the tokens chosen makes of them may score otherwise
TWIN_TIES = {
    ("tiny_vocabulary", "nothing given: translate_batch's defaults"): {1},
    ("tiny_vocabulary", "beam 2, translate_batch's defaults"): {1},
    ("tiny_vocabulary", "beam 4, 4 hypotheses, decoding length 0 to 6"): {1, 2, 7, 11},
    ("tiny_vocabulary", "beam 8, 2 hypotheses, repetition_penalty 1.2, no_repeat_ngram_size 3, "
                        "length 3 to 12"): {1, 3, 5, 6, 7, 8, 9, 10}}


def options_of(case: dict) -> dict:
    return {**DEFAULTS, **{OPTIONS[k]: v for k, v in case["options"].items()}}


def assert_same(results, expected):
    assert len(results) == len(expected)
    for number, (result, theirs) in enumerate(zip(results, expected), 1):
        assert [" ".join(p) for p in result.preds] == [h for h, _ in theirs], number
        assert result.scores == pytest.approx([s for _, s in theirs], abs=SCORE_TOLERANCE,
                                               rel=2e-6), number


@pytest.fixture(scope="module")
def lines():
    with open(SOURCE, encoding="utf-8") as f:
        return [next(f).rstrip("\n") for _ in range(150)]


@needs_shared
@pytest.mark.parametrize("case", list(REF["cases"]))
def test_ctranslate2_search_is_ctranslate2s(case, lines):
    translator = build_translator({"model": MODEL, "search": "ctranslate2",
                                   **options_of(REF["cases"][case])})
    assert_same(translator.translate(lines, batch_size=32), REF["cases"][case]["hypotheses"])


@needs_shared
@pytest.mark.parametrize("case", list(REF["prefix_cases"]))
def test_target_prefixes_are_ctranslate2s(case, lines):
    """-tgt_file_prefix is translate_batch's target_prefix: the prefix is forced and returned,
    the score counts what follows it (two lines in three have a prefix, the others none)."""
    translator = build_translator({"model": MODEL, "search": "ctranslate2",
                                   "tgt_file_prefix": True,
                                   **options_of(REF["prefix_cases"][case])})
    prefixes = [" ".join(p) for p in REF["prefixes"]]
    assert_same(translator.translate(lines, prefixes, batch_size=32),
                REF["prefix_cases"][case]["hypotheses"])


@needs_shared
@pytest.mark.parametrize("case", list(REF["line_cases"]))
def test_batches_without_prefixes_greedy_patience_and_early_exit_are_ctranslate2s(case):
    """A few lines each with its prefix or none, in batches of translate_batch's
    max_batch_size (one batch, or one line each): a batch whose lines have no prefix decodes as
    one without target_prefix, a line without one beside lines with prefixes does not; greedy
    search ends at the first </s> whatever -patience; with length_penalty 0 a sentence ends
    when its top beam has ended and -n_best are recorded, not after beam * patience."""
    ref = REF["line_cases"][case]
    translator = build_translator({"model": MODEL, "search": "ctranslate2",
                                   "tgt_file_prefix": True, **options_of(ref)})
    assert_same(translator.translate(ref["lines"], [" ".join(p) for p in ref["prefixes"]],
                                     batch_size=ref["batch"]), ref["hypotheses"])


@pytest.mark.parametrize("case", list(REF["marian_cases"]))
def test_a_marian_model_decodes_as_ctranslate2_converts_it(case):
    """CTranslate2's converter drops <pad> from the vocabulary and no generation setting
    applies; an empty line (the tokenizer's lone </s>) gives an empty translation, score 0."""
    translator = build_translator({"model": MARIAN, "search": "ctranslate2",
                                   **options_of(REF["marian_cases"][case])})
    lines = REF["marian_lines"]
    assert "" in lines
    results = translator.translate(lines, batch_size=32)
    assert_same([_pieces(r) for r in results], REF["marian_cases"][case]["hypotheses"])


def _pieces(result):
    """Marian results as CTranslate2 gives them: pieces without </s>."""
    result.preds = [[p for p in pred if p != "</s>"] for pred in result.preds]
    return result


def test_a_prefix_is_forced_from_the_first_hypothesis_and_then_set_free():
    """While its prefix lasts, every candidate of a sentence is the prefix's next token from
    hypothesis 0, score 0 for the first and -1e10 for the others; at the first free step a </s>
    other than the best candidate becomes a dead end."""
    eos = 3
    rule = ReplaceFinished(eos=eos, max_length=10, n_best=1,
                           prefixes=torch.tensor([[7, 8, eos], [eos, 1, 1]]))
    values = torch.tensor([[-0.1, -0.5, -0.7, -0.9], [-0.2, -0.3, -0.6, -0.8]])
    origin, tokens = torch.tensor([[0, 1, 0, 1]] * 2), torch.tensor([[3, 5, 3, 6], [4, 3, 5, 3]])
    forced, origins, chosen = rule.revise(values, origin, tokens, step=1)
    assert forced[0].tolist() == [0.0, -1e10, -1e10, -1e10] and chosen[0].tolist() == [7] * 4
    assert origins[0].tolist() == [0, 0, 0, 0]
    assert forced[1].tolist() == pytest.approx([-0.2, -1e10, -0.6, -1e10])  # free: </s> dead
    assert chosen[1].tolist() == [4, 0, 5, 0] and origins[1].tolist() == [0, 0, 0, 0]
    forced, _, chosen = rule.revise(values, origin, tokens, step=4)  # both past the rule
    assert torch.equal(forced, values) and torch.equal(chosen, tokens)


def test_the_preset_takes_translate_batchs_length_defaults(tmp_path):
    """With no -max_length or -min_length, -search ctranslate2 decodes up to 256 tokens
    (max_decoding_length) and never ends before the first (min_decoding_length 1), as
    translate_batch does; options given still win."""
    ckpt = tiny_checkpoint(tmp_path / "m.pt")
    model = load_checkpoint(ckpt)
    eos = model.tgt_vocab.stoi["</s>"]
    generator = dict(model.generator_state)
    never, first = dict(generator), dict(generator)
    never["bias"] = generator["bias"].clone().index_fill_(0, torch.tensor([eos]), -1e4)
    first["bias"] = generator["bias"].clone().index_fill_(0, torch.tensor([eos]), 1e4)
    for name, state in (("never.pt", never), ("first.pt", first)):
        torch.save(dict(torch.load(ckpt, weights_only=True), generator=state), tmp_path / name)
    never_ends = build_translator({"model": str(tmp_path / "never.pt"), "search": "ctranslate2",
                                   "beam_size": 2, "max_length_ratio": 0})
    assert (never_ends.opt.max_length, never_ends.opt.min_length) == (256, 1)
    assert [len(t.preds[0]) for t in never_ends.translate(["a b", "c"])] == [256, 256]
    ends_first = build_translator({"model": str(tmp_path / "first.pt"), "search": "ctranslate2",
                                   "beam_size": 2})
    assert [len(t.preds[0]) for t in ends_first.translate(["a b"])] == [1]
    given = build_translator({"model": str(tmp_path / "never.pt"), "search": "ctranslate2",
                              "beam_size": 2, "max_length": 7, "min_length": 0})
    assert (given.opt.max_length, given.opt.min_length) == (7, 0)
    assert build_translator({"model": ckpt}).opt.max_length == 250  # -search onmt: OpenNMT-py's


@pytest.mark.parametrize("model, case", [(m, c) for m, cases in REF["edge_cases"]["models"].items()
                                         for c in cases])
def test_ctranslate2s_defaults_and_limits_on_models_that_misbehave(model, case):
    """A model that never ends (every hypothesis meets the limit: 256 tokens by default) and one
    that ends at once (min_decoding_length 1 by default; empty outputs at 0): only the options
    the case gives, the others translate_batch's defaults, which the preset takes."""
    options = REF["edge_cases"]["models"][model][case]["options"]
    translator = build_translator({"model": os.path.join(ROOT, "tests", "reference",
                                                         f"marian_{model}"),
                                   "search": "ctranslate2",
                                   **{OPTIONS[k]: v for k, v in options.items()}})
    results = [_pieces(r) for r in translator.translate(REF["edge_cases"]["lines"], batch_size=32)]
    expected = REF["edge_cases"]["models"][model][case]["hypotheses"]
    twins = twin_pieces(os.path.join(ROOT, "tests", "reference", f"marian_{model}"))
    ties = {number for number, (result, theirs) in enumerate(zip(results, expected), 1)
            if [" ".join(p) for p in result.preds] != [h for h, _ in theirs]}
    assert ties == TWIN_TIES.get((model, case), set())
    for number in ties:  # the same hypotheses but for tokens of equal embeddings and bias
        ours, theirs = results[number - 1].preds, [h.split() for h, _ in expected[number - 1]]
        assert [[twins.get(t, t) for t in p] for p in ours] == \
            [[twins.get(t, t) for t in p] for p in theirs], number
    assert_same([r for i, r in enumerate(results, 1) if i not in ties],
                [h for i, h in enumerate(expected, 1) if i not in ties])


def test_logits_are_read_only_at_the_steps_a_processor_acts(tmp_path, monkeypatch):
    """CTranslate2's processors act on logits, the log-softmax after them; at a step where
    none acts (after -min_length, before the last step) that is the model's log_probs, which
    the step then takes (a compiled output program, where there is one). The hypotheses and
    scores are those of reading logits at every step, to the bit."""
    ckpt = tiny_checkpoint(tmp_path / "m.pt")
    options = {"model": ckpt, "search": "ctranslate2", "beam_size": 3, "n_best": 3,
               "min_length": 2, "max_length": 9, "repetition_penalty": 1.0}
    lines = ["a b c", "d e", "f a b c d"]
    translator = build_translator(options)
    model = translator.model
    asked, log_probs, step = [], model.log_probs, model.decoder.step
    monkeypatch.setattr(model, "log_probs", lambda out: asked.append("log_probs") or log_probs(out))
    monkeypatch.setattr(model.decoder, "step", lambda tokens: asked.append("step") or step(tokens))
    quick = translator.translate(lines, batch_size=3)
    import dataclasses

    import onmt_lite.translate.translator as translator_module
    from onmt_lite.search.processors import Processor

    class Unchanged(Processor):  # acts at every step (Processor.acts), changing nothing
        def __call__(self, scores, step, history):
            pass
    build_search = translator_module.build_search

    def with_unchanged(*args, **kwargs):
        search = build_search(*args, **kwargs)
        return dataclasses.replace(search, processors=[*search.processors, Unchanged()])
    monkeypatch.setattr(translator_module, "build_search", with_unchanged)
    every = build_translator(options).translate(lines, batch_size=3)
    assert [t.preds for t in quick] == [t.preds for t in every]
    assert [t.scores for t in quick] == [t.scores for t in every]
    steps = asked.count("step")
    assert steps > 3 and asked.count("log_probs") == steps - 2  # not at steps 1, 2 (min_length)
