"""``-search hf`` is Hugging Face ``generate``: the same hypotheses, in the same order, with the
same scores, on tiny Marian models, for every beam-search setting that changes the result."""
import hashlib
import os
import sys

import pytest
from marian_dirs import (
    OPUS_GENERATION,
    SOURCES,
    generated_ids,
    run_generate,
    sentences,
    without_trailing,
    write_marian,
)

from onmt_lite.models.onednn import cpu_vendor
from onmt_lite.translate import build_translator

transformers = pytest.importorskip("transformers", reason="transformers is the oracle here "
                                                          "(pip install -e '.[test]')")
import torch  # noqa: E402

LINES = SOURCES + sentences(24, seed=11)
# </s> made likelier, so that hypotheses end at every length and not only at the limit
DIRECTORIES = {  # name -> write_marian arguments
    "OPUS-MT settings (pad banned, </s> forced, renormalised)": dict(seed=6, eos_bias=3.0),
    "pad banned, not renormalised": dict(
        seed=7, eos_bias=3.5, generation={**OPUS_GENERATION, "renormalize_logits": False}),
    "no generation_config.json": dict(generation=None, seed=8, eos_bias=4.0),
}
# name -> (generate() arguments, the same in onmt_lite's options)
CASES = {
    "beam 4": (dict(num_beams=4), dict(beam_size=4)),
    "beam 5, 3 returned, early_stopping True": (
        dict(num_beams=5, num_return_sequences=3, early_stopping=True),
        dict(beam_size=5, n_best=3, early_stopping="true")),
    "beam 3, early_stopping never, length_penalty 0.6": (
        dict(num_beams=3, early_stopping="never", length_penalty=0.6),
        dict(beam_size=3, early_stopping="never", alpha=0.6)),
    "beam 4, length_penalty 0, min 6 new tokens": (
        dict(num_beams=4, length_penalty=0.0, min_new_tokens=6),
        dict(beam_size=4, alpha=0.0, min_length=6)),
    "beam 4, length_penalty -0.5, 2 returned": (
        dict(num_beams=4, length_penalty=-0.5, num_return_sequences=2),
        dict(beam_size=4, alpha=-0.5, n_best=2)),
    "beam 4, no_repeat_ngram_size 2, repetition_penalty 1.3": (
        dict(num_beams=4, no_repeat_ngram_size=2, repetition_penalty=1.3),
        dict(beam_size=4, block_ngram_repeat=2, repetition_penalty=1.3)),
    "beam 6, 5 new tokens at most": (
        dict(num_beams=6, max_new_tokens=5, num_return_sequences=6),
        dict(beam_size=6, max_length=5, n_best=6)),
    "beam 2, early_stopping never, length_penalty 2": (
        dict(num_beams=2, early_stopping="never", length_penalty=2.0),
        dict(beam_size=2, early_stopping="never", alpha=2.0)),
    "greedy, repetition_penalty 1.5, no_repeat_ngram_size 3": (
        dict(num_beams=1, repetition_penalty=1.5, no_repeat_ngram_size=3),
        dict(beam_size=1, repetition_penalty=1.5, block_ngram_repeat=3)),
}


def hf_hypotheses(folder, lines, **kwargs):
    """generate()'s hypotheses per line: [(pieces with </s>, sequences_scores or None)]."""
    tokenizer, model, out = run_generate(folder, lines, **kwargs)
    n = kwargs.get("num_return_sequences", 1)
    eos, pad = model.generation_config.eos_token_id, model.config.pad_token_id
    scores = out.sequences_scores.tolist() if kwargs["num_beams"] > 1 else [None] * len(
        out.sequences)
    hyps = [(tokenizer.convert_ids_to_tokens(generated_ids(seq, eos, pad)), score)
            for seq, score in zip(out.sequences.tolist(), scores)]
    return [hyps[i:i + n] for i in range(0, len(hyps), n)]


# (directory, case, line) where two hypotheses tie: generate() gives them the same float
# score and onmt_lite scores that differ in the last bit, so they come in the other order
FLOAT_TIES = {("no generation_config.json",
               "beam 4, no_repeat_ngram_size 2, repetition_penalty 1.3", "Is is woman?")}


@pytest.fixture(scope="module", params=list(DIRECTORIES))
def named_folder(request, tmp_path_factory):
    return request.param, write_marian(tmp_path_factory.mktemp("marian"),
                                       **DIRECTORIES[request.param])


@pytest.mark.parametrize("case", list(CASES))
def test_hf_search_is_generates(named_folder, case):
    name, folder = named_folder
    theirs_args, ours_args = CASES[case]
    theirs_args = {"max_new_tokens": 20, **theirs_args}  # generate()'s default is 20 in all
    ours_args = {"max_length": theirs_args["max_new_tokens"], **ours_args}
    translator = build_translator({"model": folder, "search": "hf", **ours_args})
    results = translator.translate(LINES, batch_size=len(LINES))
    expected = hf_hypotheses(folder, LINES, **theirs_args)
    eos = translator.tgt_vocab.specials["eos"]
    ties = set()
    assert len(results) == len(expected) == len(LINES)
    for line, result, theirs in zip(LINES, results, expected):
        assert len(result.preds) == len(result.scores) == len(theirs), line  # none left over
        ours = [(pred + [eos] * (tokens[-1:] == [eos]), score)
                for pred, score, (tokens, _) in zip(result.preds, result.scores, theirs)]
        if [tokens for tokens, _ in ours] != [tokens for tokens, _ in theirs]:
            ties.add((name, case, line))  # equal scores, other hypotheses in front
            assert [s for _, s in ours] == pytest.approx([s for _, s in theirs], abs=1e-6)
            continue
        for rank, ((tokens, score), (their_tokens, their_score)) in enumerate(zip(ours, theirs)):
            assert tokens == their_tokens, (line, rank)
            if their_score is not None:
                assert score == pytest.approx(their_score, abs=1e-4), (line, rank)
    assert ties == {tie for tie in FLOAT_TIES if tie[:2] == (name, case)}


# Models that misbehave: one never ends by itself (every hypothesis meets the limit), one likes
# </s> at once (empty and one-token hypotheses everywhere); an empty line among the inputs.
MISBEHAVING = {"never ends": dict(seed=2, eos_bias=-30.0), "ends at once": dict(seed=3, eos_bias=6.0)}
EDGE_LINES = SOURCES[:6] + sentences(6, seed=3) + [""]
# (beam, early_stopping, length_penalty, max_new_tokens, min_new_tokens): the limits at and near
# the outputs' lengths, each stopping rule, penalties favouring short and long hypotheses
EDGE_CASES = [(1, "false", 1.0, 4, 0), (1, "false", 1.0, 12, 3), (3, "false", 0.0, 4, 3),
              (3, "true", 1.0, 12, 0), (3, "never", -1.0, 12, 3), (6, "false", -1.0, 4, 0),
              (6, "true", 0.0, 12, 3), (6, "never", 1.0, 4, 3)]


@pytest.mark.parametrize("model", list(MISBEHAVING))
def test_hf_search_is_generates_at_the_edges(model, tmp_path):
    """Every hypothesis and score of generate() where the limits decide (an empty output at
    min_new_tokens 0, every hypothesis cut at max_new_tokens), for each stopping rule."""
    folder = write_marian(tmp_path / "m", **MISBEHAVING[model])
    for beam, early, alpha, longest, shortest in EDGE_CASES:
        n = min(beam, 2)
        theirs_args = dict(num_beams=beam, max_new_tokens=longest, num_return_sequences=n,
                           length_penalty=alpha, min_new_tokens=shortest)
        if beam > 1:
            theirs_args["early_stopping"] = {"true": True, "false": False}.get(early, early)
        translator = build_translator({
            "model": folder, "search": "hf", "beam_size": beam, "n_best": n, "alpha": alpha,
            "early_stopping": early, "max_length": longest, "min_length": shortest})
        results = translator.translate(EDGE_LINES, batch_size=5)
        expected = hf_hypotheses(folder, EDGE_LINES, **theirs_args)
        eos = translator.tgt_vocab.specials["eos"]
        case = (beam, early, alpha, longest, shortest)
        for line, result, theirs in zip(EDGE_LINES, results, expected):
            ours = [(pred + [eos] * (tokens[-1:] == [eos]), score)
                    for pred, score, (tokens, _) in zip(result.preds, result.scores, theirs)]
            assert len(result.preds) == len(theirs), (case, line)
            assert [t for t, _ in ours] == [t for t, _ in theirs], (case, line)
            for (_, score), (_, their_score) in zip(ours, theirs):
                if their_score is not None:
                    assert score == pytest.approx(their_score, abs=1e-4), (case, line)


@pytest.mark.parametrize("renormalised", [True, False])
def test_hf_search_returns_what_generate_does_when_every_piece_is_banned(renormalised, tmp_path):
    """Each piece of the tiny vocabulary used once (no_repeat_ngram_size 1) before </s> may come
    (min_new_tokens): every candidate is -inf, NaN once renormalised. generate() then fills its
    finished slots with whatever wins the merge of finished and running candidates, ended or
    not, and returns those sequences (the NaN or -1e9 scores included)."""
    generation = {**OPUS_GENERATION, "renormalize_logits": renormalised}
    folder = write_marian(tmp_path / "m", seed=4, eos_bias=1.0, tiny_target=True,
                          generation=generation)
    lines = ["A man is riding a bike.", "dog", "Two dogs play in the snow."]
    for beam in (2, 3, 5):
        theirs_args = dict(num_beams=beam, num_return_sequences=2, max_new_tokens=12,
                           min_new_tokens=12, no_repeat_ngram_size=1)
        translator = build_translator({
            "model": folder, "search": "hf", "beam_size": beam, "n_best": 2, "max_length": 12,
            "min_length": 12, "block_ngram_repeat": 1})
        results = translator.translate(lines, batch_size=2)
        expected = hf_hypotheses(folder, lines, **theirs_args)
        pad = translator.tgt_vocab.specials["pad"]
        for line, result, theirs in zip(lines, results, expected):
            ours = [(without_trailing(pred, pad), score)  # as generated_ids reads generate()'s
                    for pred, score in zip(result.preds, result.scores)]
            if INTEL_AVX512 or not renormalised:
                assert [t for t, _ in ours] == [t for t, _ in theirs], (beam, line)
            else:  # on other CPUs (an AMD EPYC with AVX2) the two models' last bits differ, and
                # the pieces chosen before the NaN steps, near-tied, go either way
                assert [len(t) for t, _ in ours] == [len(t) for t, _ in theirs], (beam, line)
            for (_, score), (_, their_score) in zip(ours, theirs):
                assert score == pytest.approx(their_score, abs=1e-4, nan_ok=True), (beam, line)


def test_onmt_and_hf_searches_differ_where_their_rules_do(tmp_path):
    """The same model and flags: OpenNMT-py's search and generate()'s keep different
    hypotheses on some lines (a guard that -search is not ignored)."""
    folder = write_marian(tmp_path, seed=6, eos_bias=3.0)
    options = dict(model=folder, beam_size=4, n_best=4, alpha=1.0)
    onmt = build_translator({**options, "search": "onmt"}).translate(LINES, batch_size=8)
    hf = build_translator({**options, "search": "hf"}).translate(LINES, batch_size=8)
    assert any(a.preds != b.preds or a.scores != b.scores for a, b in zip(onmt, hf))


def test_hf_only_flags_are_refused_with_onmt_options(tmp_path):
    folder = write_marian(tmp_path, seed=6)
    with pytest.raises(ValueError, match="-coverage_penalty is OpenNMT-py's"):
        build_translator({"model": folder, "search": "hf", "coverage_penalty": "wu"})
    with pytest.raises(ValueError, match="-early_stopping must be one of"):
        build_translator({"model": folder, "search": "hf", "early_stopping": "maybe"})


def test_beam_sampling_draws_candidates_in_proportion_without_replacement():
    from onmt_lite.search.candidates import BeamSampler
    scores = torch.log(torch.tensor([[[0.5, 0.3, 0.15, 0.05]]]))  # one sentence, k = 1
    sampler = BeamSampler(torch.Generator().manual_seed(0))
    firsts = torch.zeros(4)
    for _ in range(4000):
        values, ids = sampler.pick(scores, 1)
        assert ids[0, 0] != ids[0, 1]  # 2k distinct candidates
        assert values.tolist() == scores.view(1, -1).gather(1, ids).tolist()
        firsts[ids[0, 0]] += 1
    share = firsts / firsts.sum()  # each within 4 standard errors of its probability
    for p, seen in zip([0.5, 0.3, 0.15, 0.05], share.tolist()):
        assert abs(seen - p) < 4 * (p * (1 - p) / 4000) ** 0.5


def test_warpers_are_hugging_faces():
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    from onmt_lite.search.processors import Warper
    scores = torch.randn(6, 50, generator=torch.Generator().manual_seed(3)).log_softmax(1)
    for temperature, top_k, top_p in ((0.7, 5, 0.0), (1.0, 0, 0.8), (1.3, 10, 0.9), (1, 1, 0)):
        theirs = TemperatureLogitsWarper(temperature)(None, scores.clone()) \
            if temperature != 1 else scores.clone()
        if top_k:
            theirs = TopKLogitsWarper(top_k, min_tokens_to_keep=2)(None, theirs)
        if top_p:
            theirs = TopPLogitsWarper(top_p, min_tokens_to_keep=2)(None, theirs)
        ours = scores.clone()
        Warper(temperature, top_k, top_p, min_keep=2)(ours, 1, None)
        assert torch.equal(ours, theirs), (temperature, top_k, top_p)


def test_beam_sampling_is_seeded_and_keeps_one_line_per_input(tmp_path):
    folder = write_marian(tmp_path, seed=6, eos_bias=3.0)

    def run(seed):
        translator = build_translator({"model": folder, "search": "hf", "beam_size": 3,
                                       "n_best": 2, "random_sampling_topk": -1, "seed": seed})
        return [r.preds for r in translator.translate(LINES, batch_size=8)]

    first = run(7)
    assert run(7) == first and run(8) != first
    assert all(len(preds) == 2 for preds in first)
    greedy_beam = build_translator({"model": folder, "search": "hf", "beam_size": 3})
    with pytest.raises(ValueError, match="or -search hf: beam sampling"):
        build_translator({"model": folder, "beam_size": 3, "random_sampling_topk": -1})
    assert greedy_beam.opt.beam_size == 3


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference"))
import hunt_hf  # noqa: E402

# (model, setting's index in hunt_hf.settings, the line's sha1[:12]) where the quick hunt below
# meets a tie (hunt_hf's docstring): the first hypotheses that differ are twins of the tiny
# vocabulary, part first at twins, or score the same within 1e-5. Measured on an Intel Xeon
# with AVX-512 (the float sums of its products' kernels decide which ties a search meets).
TINY = "tiny vocabulary, exact ties"
# The third: this tie-prone line takes the other branch of an exact tie at the edge of the
# beam (gap 0, measured by hunt_hf.compare) under setting 7 (beam 2, at least 10 tokens), and
# the two searches end on hypotheses that score differently (-1.1022 against generate()'s
# -1.0796); on AVX2 both searches take the same branch.
INTEL_AVX512_TIES = {(TINY, 6, 'e2ed9d6a303e'), (TINY, 6, '735bf20031a7'),
                     (TINY, 7, '24ab47f6db09')}


INTEL_AVX512 = torch.backends.cpu.get_cpu_capability().startswith("AVX512") \
    and cpu_vendor() == "GenuineIntel"


@pytest.mark.parametrize("model", list(hunt_hf.MODELS))
def test_a_quick_hunt_finds_generates_hypotheses_but_named_ties(model):
    """tests/reference/hunt_hf.py's first 8 settings (greedy, generate()'s defaults, limits of
    1 to 30 tokens, each early_stopping, length penalties -1 to 2, beams up to 12, batches of
    1, 7 and 64) on the edge lines, 6 Multi30k training and 3 test lines (where ../shared has
    them): every hypothesis the same, but the ties named above."""
    rows = hunt_hf.hunt(8, 6, 3, [model])
    found = [(name, setting, line, r) for name, setting, lines, _ in rows for line, r in lines]
    index = {name: i for i, (name, *_) in enumerate(hunt_hf.settings(8))}
    assert [f for f in found if f[3] != "same" and f[3][0] == "differs"] == []
    ties = {(name, index[setting], _digest(line)) for name, setting, line, r in found
            if r != "same"}
    seen = {_digest(line) for _, _, line, _ in found}
    if INTEL_AVX512:
        assert ties == {t for t in INTEL_AVX512_TIES if t[0] == model and t[2] in seen}
    # elsewhere the ties met depend on the CPU's kernels (an AMD EPYC with AVX2 only met ties
    # in settings 5 and 7 that another AVX2 CPU did not): only a difference fails there


def _digest(line: str) -> str:
    return hashlib.sha1(line.encode()).hexdigest()[:12]
