"""Beam on hand-built log-prob tables (OpenNMT-py 3.5.1 BeamSearch semantics).

Vocabulary (6 tokens): 0 <unk>, 1 <blank> (pad), 2 <s>, 3 </s>, 4 A, 5 B.
A table row is {token: probability}; tokens left out have probability 0 (log-prob -inf).
Every expectation is worked out by hand in the comments: "AB .30" means the path A B has
probability .30 (the product of its step probabilities). Hypothesis 0 is "slot 0" (k = 0).
"""
import math

import pytest
import torch

from onmt_lite.constants import BLOCKED_SCORE, FINISHED_SCORE
from onmt_lite.search.beam import Beam
from onmt_lite.search.global_scorer import GNMTGlobalScorer

torch.set_num_threads(1)

UNK, PAD, BOS, EOS, A, B = range(6)
VOCAB_SIZE = 6
SRC_LEN = 2


def log_probs(*rows):
    """(len(rows), 6) log-probabilities from {token: probability} rows."""
    probs = torch.zeros(len(rows), VOCAB_SIZE)
    for i, row in enumerate(rows):
        for token, p in row.items():
            probs[i, token] = p
    return probs.log()


def attention(*rows):
    return torch.tensor(rows, dtype=torch.float)


def flat_attention(size):
    return torch.full((size, SRC_LEN), 0.5)


def make_beam(size, **kwargs):
    return Beam(size, pad=PAD, bos=BOS, eos=EOS, **kwargs)


def ln(p):
    return math.log(p)


def assert_rows(actual, rows):
    torch.testing.assert_close(actual, torch.tensor(rows), rtol=0, atol=1e-6)


# -- first step and back-pointers -------------------------------------------------------------
def test_initial_state():
    beam = make_beam(3)
    assert beam.get_current_state().tolist() == [BOS, BOS, BOS]
    assert beam.scores.tolist() == [0.0, -math.inf, -math.inf]
    assert not beam.done()
    assert beam.finished == []


def test_first_step_expands_only_hypothesis_0():
    beam = make_beam(3)
    # Rows 1 and 2 would win if they counted (</s> .9), but only row 0 is expanded:
    # its top 3 are A .5, B .3, <unk> .15 (</s> .05 is 4th).
    beam.advance(log_probs({A: .5, B: .3, UNK: .15, EOS: .05},
                           {EOS: .9, A: .1},
                           {EOS: .9, B: .1}), flat_attention(3))
    assert beam.get_current_origin().tolist() == [0, 0, 0]
    assert beam.get_current_state().tolist() == [A, B, UNK]
    assert beam.scores.tolist() == pytest.approx([ln(.5), ln(.3), ln(.15)], abs=1e-6)
    assert beam.all_scores[0].tolist() == pytest.approx([ln(.5), ln(.3), ln(.15)], abs=1e-6)
    assert beam.finished == []
    assert not beam.eos_top
    assert not beam.done()


def _three_steps_without_eos():
    """Beam 2 over three steps; the winning path switches parents twice."""
    beam = make_beam(2)
    # step 1: A .6, B .4 -> [A, B] from [0, 0]
    beam.advance(log_probs({A: .6, B: .4}, {A: 1.0}),
                 attention([.1, .9], [.5, .5]))
    # step 2: A -> B .6 * .55 = .33, A -> A .6 * .45 = .27; B -> A .4 * .9 = .36, B -> B .04
    #         top 2: BA .36 (from 1), AB .33 (from 0)
    beam.advance(log_probs({B: .55, A: .45}, {A: .9, B: .1}),
                 attention([.2, .8], [.3, .7]))
    # step 3: BA -> A .36 * .3 = .108, BA -> B .36 * .7 = .252;
    #         AB -> A .33 * .9 = .297, AB -> B .33 * .1 = .033
    #         top 2: ABA .297 (from 1), BAB .252 (from 0)
    beam.advance(log_probs({A: .3, B: .7}, {A: .9, B: .1}),
                 attention([.4, .6], [.6, .4]))
    return beam


def test_back_pointers_and_tokens_after_several_steps():
    beam = _three_steps_without_eos()
    assert [p.tolist() for p in beam.prev_ks] == [[0, 0], [1, 0], [1, 0]]
    assert [y.tolist() for y in beam.next_ys] == [[BOS, BOS], [A, B], [A, B], [A, B]]
    # running scores: ABA .6 * .55 * .9 = .297, BAB .4 * .9 * .7 = .252
    assert beam.scores.tolist() == pytest.approx([ln(.297), ln(.252)], abs=1e-5)
    assert beam.finished == []
    assert not beam.done()


def test_get_hyp_walks_back_pointers():
    beam = _three_steps_without_eos()
    tokens, attn = beam.get_hyp(3, 0)
    # slot 0 at step 3 came from slot 1 at step 2, which came from slot 0 at step 1: A B A
    assert tokens == [A, B, A]
    # attention rows of the rows it came from: step 1 row 0 [.1 .9], step 2 row 0 [.2 .8]
    # (slot 1 at step 2 was fed by row 0), step 3 row 1 [.6 .4]
    assert_rows(attn, [[.1, .9], [.2, .8], [.6, .4]])
    tokens, attn = beam.get_hyp(3, 1)
    # slot 1 at step 3 <- slot 0 at step 2 <- slot 1 at step 1: B A B
    assert tokens == [B, A, B]
    assert_rows(attn, [[.1, .9], [.3, .7], [.4, .6]])
    # an earlier timestep: slot 0 at step 2 is B A
    tokens, attn = beam.get_hyp(2, 0)
    assert tokens == [B, A]
    assert_rows(attn, [[.1, .9], [.3, .7]])


# -- </s>: finished hypotheses ----------------------------------------------------------------
def _eos_beam():
    beam = make_beam(2)
    # step 1: A .6, </s> .3 (B .1 is 3rd) -> [A, </s>]; "</s>" finishes with ln .3
    beam.advance(log_probs({A: .6, EOS: .3, B: .1}, {B: 1.0}),
                 attention([.2, .8], [.5, .5]))
    return beam


def test_eos_hypothesis_is_finished_and_keeps_its_slot():
    beam = _eos_beam()
    assert beam.get_current_state().tolist() == [A, EOS]  # the </s> keeps slot 1
    assert beam.get_current_origin().tolist() == [0, 0]
    assert len(beam.finished) == 1
    score, timestep, k = beam.finished[0]
    assert (timestep, k) == (1, 1)
    assert score == pytest.approx(ln(.3), abs=1e-6)
    # its running score becomes FINISHED_SCORE; the live one keeps ln .6
    assert FINISHED_SCORE == -65504.0
    assert beam.scores.tolist() == pytest.approx([ln(.6), -65504.0], abs=1e-6)
    assert not beam.eos_top  # the top candidate is A
    assert not beam.done()


def test_finished_slot_is_replaced_next_step_and_search_ends_on_eos_top():
    beam = _eos_beam()
    # step 2: A -> B .6 * .5 = .30, A -> </s> .6 * .4 = .24, A -> A .06;
    #         slot 1 (finished) would give </s> -> A .9, but its score is -65504
    #         top 2: AB .30 (from 0), A</s> .24 (from 0): slot 1 is replaced
    beam.advance(log_probs({B: .5, EOS: .4, A: .1}, {A: .9, B: .1}),
                 attention([.3, .7], [.5, .5]))
    assert beam.get_current_origin().tolist() == [0, 0]
    assert beam.get_current_state().tolist() == [B, EOS]
    assert [(t, k) for _, t, k in beam.finished] == [(1, 1), (2, 1)]
    assert beam.finished[1][0] == pytest.approx(ln(.24), abs=1e-6)
    assert not beam.eos_top and not beam.done()
    # step 3: AB -> </s> .30 * .7 = .21, AB -> A .09; slot 1 (A </s>) is finished
    #         top 2: AB</s> .21 (from 0), ABA .09 (from 0): </s> on top -> done
    beam.advance(log_probs({EOS: .7, A: .3}, {A: 1.0}),
                 attention([.6, .4], [.5, .5]))
    assert beam.get_current_origin().tolist() == [0, 0]
    assert beam.get_current_state().tolist() == [EOS, A]
    assert beam.eos_top
    assert beam.done()
    assert [(t, k) for _, t, k in beam.finished] == [(1, 1), (2, 1), (3, 0)]
    assert beam.finished[2][0] == pytest.approx(ln(.21), abs=1e-5)


def test_get_hyp_includes_eos_and_attention():
    beam = _eos_beam()
    beam.advance(log_probs({B: .5, EOS: .4, A: .1}, {A: .9, B: .1}),
                 attention([.3, .7], [.5, .5]))
    beam.advance(log_probs({EOS: .7, A: .3}, {A: 1.0}),
                 attention([.6, .4], [.5, .5]))
    # without <s>, with </s>; one attention row per token (all from row 0 here)
    tokens, attn = beam.get_hyp(3, 0)
    assert tokens == [A, B, EOS]
    assert_rows(attn, [[.2, .8], [.3, .7], [.6, .4]])
    tokens, attn = beam.get_hyp(2, 1)
    assert tokens == [A, EOS]
    assert_rows(attn, [[.2, .8], [.3, .7]])
    tokens, attn = beam.get_hyp(1, 1)
    assert tokens == [EOS]
    assert_rows(attn, [[.2, .8]])


@pytest.mark.parametrize("n_best, done", [(1, True), (2, False)])
def test_eos_on_top_is_done_only_with_n_best_finished(n_best, done):
    beam = make_beam(2, n_best=n_best)
    # step 1: </s> .5 on top, A .4 second: one hypothesis finished
    beam.advance(log_probs({EOS: .5, A: .4, B: .1}, {A: 1.0}), flat_attention(2))
    assert beam.eos_top
    assert len(beam.finished) == 1
    assert beam.done() is done


def test_done_needs_eos_on_top_at_that_step():
    beam = make_beam(2, n_best=2)
    # step 1: </s> .5 (slot 0, finished), A .4 -> eos_top, 1 finished < 2: not done
    beam.advance(log_probs({EOS: .5, A: .4, B: .1}, {A: 1.0}), flat_attention(2))
    assert beam.eos_top and not beam.done()
    # step 2: A -> B .4 * .5 = .20, A -> </s> .4 * .3 = .12, A -> A .08; slot 0 is finished
    #         top 2: AB .20 (from 1), A</s> .12 (from 1): 2 finished but B is on top: not done
    beam.advance(log_probs({A: 1.0}, {B: .5, EOS: .3, A: .2}), flat_attention(2))
    assert beam.get_current_origin().tolist() == [1, 1]
    assert beam.get_current_state().tolist() == [B, EOS]
    assert len(beam.finished) == 2
    assert not beam.eos_top and not beam.done()
    # step 3: AB -> </s> .20 * .7 = .14 on top, AB -> A .06: done
    beam.advance(log_probs({EOS: .7, A: .3}, {A: 1.0}), flat_attention(2))
    assert beam.eos_top and beam.done()
    scores, ks = beam.sort_finished()
    # </s> .5 > AB</s> .14 > A</s> .12
    assert ks == [(1, 0), (3, 0), (2, 1)]
    assert scores == pytest.approx([ln(.5), ln(.14), ln(.12)], abs=1e-5)
    assert [beam.get_hyp(t, k)[0] for t, k in ks] == [[EOS], [A, B, EOS], [A, EOS]]


# -- min_length / max_length ------------------------------------------------------------------
def test_min_length_forbids_eos_until_enough_words():
    beam = make_beam(2, min_length=2)
    # step 1 (prefix length 1 <= 2): </s> .7 is forbidden -> A .2, B .1
    beam.advance(log_probs({EOS: .7, A: .2, B: .1}, {A: 1.0}), flat_attention(2))
    assert beam.get_current_state().tolist() == [A, B]
    assert beam.finished == []
    # step 2 (prefix length 2 <= 2): </s> .9 still forbidden -> AB .2 * .1 = .02,
    #         BA .1 * .1 = .01
    beam.advance(log_probs({EOS: .9, B: .1}, {EOS: .9, A: .1}), flat_attention(2))
    assert beam.get_current_origin().tolist() == [0, 1]
    assert beam.get_current_state().tolist() == [B, A]
    assert beam.finished == []
    # step 3 (prefix length 3 > 2): </s> allowed -> AB</s> .02 * .9 = .018,
    #         BA</s> .01 * .9 = .009
    beam.advance(log_probs({EOS: .9, A: .1}, {EOS: .9, B: .1}), flat_attention(2))
    assert beam.get_current_state().tolist() == [EOS, EOS]
    assert beam.done()
    scores, ks = beam.sort_finished()
    assert ks == [(3, 0), (3, 1)]
    assert scores == pytest.approx([ln(.018), ln(.009)], abs=1e-5)
    assert beam.get_hyp(3, 0)[0] == [A, B, EOS]  # two words before </s>
    assert beam.get_hyp(3, 1)[0] == [B, A, EOS]


def test_min_length_gives_eos_finished_score():
    beam = make_beam(2, min_length=1)
    # step 1: </s> gets -65504 instead of ln .7; only A (ln .3) and </s> are finite
    beam.advance(log_probs({EOS: .7, A: .3}, {A: 1.0}), flat_attention(2))
    assert beam.get_current_state().tolist() == [A, EOS]
    assert beam.all_scores[0].tolist() == pytest.approx([ln(.3), -65504.0], abs=1e-6)
    assert beam.finished == [(-65504.0, 1, 1)]
    assert not beam.done()  # A is on top
    # step 2 (prefix length 2 > 1): A -> </s> .3 * .6 = .18 on top, A -> B .12
    beam.advance(log_probs({EOS: .6, B: .4}, {A: 1.0}), flat_attention(2))
    assert beam.done()
    scores, ks = beam.sort_finished()
    assert ks[0] == (2, 0)
    assert scores[0] == pytest.approx(ln(.18), abs=1e-6)
    assert beam.get_hyp(2, 0)[0] == [A, EOS]  # one word: min_length 1 met


def test_max_length_finishes_every_hypothesis():
    beam = make_beam(2, max_length=2)
    # step 1: A .6, B .4
    beam.advance(log_probs({A: .6, B: .4}, {A: 1.0}), flat_attention(2))
    assert not beam.done()
    # step 2 (= max_length): AA .6 * .7 = .42, BA .4 * .8 = .32, AB .18, BB .08
    beam.advance(log_probs({A: .7, B: .3}, {A: .8, B: .2}), flat_attention(2))
    assert beam.get_current_origin().tolist() == [0, 1]
    assert beam.get_current_state().tolist() == [A, A]
    assert not beam.eos_top
    assert beam.done()
    assert [(t, k) for _, t, k in beam.finished] == [(2, 0), (2, 1)]
    assert [s for s, _, _ in beam.finished] == pytest.approx([ln(.42), ln(.32)], abs=1e-6)
    assert beam.scores.tolist() == [FINISHED_SCORE, FINISHED_SCORE]
    # no </s> at the end of a hypothesis cut by max_length
    assert beam.get_hyp(2, 0)[0] == [A, A]
    assert beam.get_hyp(2, 1)[0] == [B, A]


# -- n-best order -----------------------------------------------------------------------------
def test_sort_finished_best_first():
    beam = make_beam(3, n_best=3)
    # step 1: A .5, B .3, </s> .2 -> "</s>" finishes first with ln .2 (slot 2)
    beam.advance(log_probs({A: .5, B: .3, EOS: .2}, {A: 1.0}, {A: 1.0}), flat_attention(3))
    assert [(t, k) for _, t, k in beam.finished] == [(1, 2)]
    # step 2: A -> </s> .5 * .6 = .30, A -> A .15, A -> B .05;
    #         B -> </s> .3 * .6 = .18, B -> A .075, B -> B .045; slot 2 finished
    #         top 3: A</s> .30 (from 0), B</s> .18 (from 1), AA .15 (from 0)
    beam.advance(log_probs({EOS: .6, A: .3, B: .1}, {EOS: .6, A: .25, B: .15}, {A: 1.0}),
                 flat_attention(3))
    assert beam.get_current_origin().tolist() == [0, 1, 0]
    assert beam.done()  # </s> on top and 3 finished
    # finishing order .2, .30, .18; best first .30, .2, .18
    scores, ks = beam.sort_finished()
    assert ks == [(2, 0), (1, 2), (2, 1)]
    assert scores == pytest.approx([ln(.30), ln(.2), ln(.18)], abs=1e-6)
    assert [beam.get_hyp(t, k)[0] for t, k in ks] == [[A, EOS], [EOS], [B, EOS]]


def test_sort_finished_ties_keep_finishing_order():
    beam = make_beam(2)
    # step 1: A .5, B .4 (</s> .1 is 3rd)
    beam.advance(log_probs({A: .5, B: .4, EOS: .1}, {A: 1.0}), flat_attention(2))
    # step 2: A -> </s> ln .5 + ln .4 (= ln .2), A -> B .175, A -> A .125;
    #         B -> A ln .4 + ln 1 = ln .4 exactly
    #         top 2: BA ln .4 (from 1), A</s> ln .5 + ln .4 (from 0)
    beam.advance(log_probs({EOS: .4, B: .35, A: .25}, {A: 1.0}), flat_attention(2))
    assert beam.get_current_origin().tolist() == [1, 0]
    assert beam.get_current_state().tolist() == [A, EOS]
    # step 3: BA -> </s> = ln .4 + ln .5, the same float as ln .5 + ln .4; BA -> B .12
    beam.advance(log_probs({EOS: .5, B: .3, A: .2}, {A: 1.0}), flat_attention(2))
    assert beam.done()
    assert beam.finished[0][0] == beam.finished[1][0]  # an exact tie
    scores, ks = beam.sort_finished()
    assert ks == [(2, 1), (3, 0)]  # A</s> finished first, so it stays first
    assert scores == pytest.approx([ln(.2), ln(.2)], abs=1e-6)
    assert [beam.get_hyp(t, k)[0] for t, k in ks] == [[A, EOS], [B, A, EOS]]


# -- length penalty ---------------------------------------------------------------------------
@pytest.mark.parametrize("name, alpha, lp2, lp3", [
    ("avg", 1.0, 2.0, 3.0),                   # L ** 1 for L = 2, 3
    ("wu", 2.0, 49 / 36, 64 / 36),            # ((5 + L) / 6) ** 2: (7/6)^2, (8/6)^2
])
def test_length_penalty_on_finished_scores(name, alpha, lp2, lp3):
    scorer = GNMTGlobalScorer(alpha=alpha, length_penalty=name)
    beam = make_beam(2, global_scorer=scorer)
    # step 1: A .6, </s> .3 -> "</s>": 0 words, L = 0 + 2, score ln .3 / lp(2)
    beam.advance(log_probs({A: .6, EOS: .3, B: .1}, {A: 1.0}), flat_attention(2))
    assert beam.finished[0][0] == pytest.approx(ln(.3) / lp2, abs=1e-6)
    # the running score of A stays the raw log-prob ln .6
    assert beam.scores[0].item() == pytest.approx(ln(.6), abs=1e-6)
    # step 2: A -> </s> .6 * .5 = .3: 1 word, L = 3, score ln .3 / lp(3); A -> B .24
    beam.advance(log_probs({EOS: .5, B: .4, A: .1}, {A: 1.0}), flat_attention(2))
    assert beam.done()
    assert beam.all_scores[1][0].item() == pytest.approx(ln(.3) / lp3, abs=1e-5)
    assert beam.all_scores[1][1].item() == pytest.approx(ln(.24) / lp3, abs=1e-5)
    assert beam.scores[1].item() == pytest.approx(ln(.24), abs=1e-5)
    # same probability .3, but the longer one is divided by more: it ranks first
    scores, ks = beam.sort_finished()
    assert ks == [(2, 0), (1, 1)]
    assert scores == pytest.approx([ln(.3) / lp3, ln(.3) / lp2], abs=1e-5)


# -- coverage penalty (not stepwise) ----------------------------------------------------------
def test_wu_coverage_penalty_reranks_finished():
    scorer = GNMTGlobalScorer(beta=1.0, coverage_penalty="wu")
    beam = make_beam(2, global_scorer=scorer)
    # step 1: A .6, B .4, both from row 0: coverage [.9 .1] for both;
    #         penalty -(ln .9 + ln .1) = 0.1053605 + 2.3025851 = 2.4079456
    beam.advance(log_probs({A: .6, B: .4}, {A: 1.0}), attention([.9, .1], [.5, .5]))
    pen1 = -(ln(.9) + ln(.1))
    assert beam.all_scores[0].tolist() == pytest.approx([ln(.6) - pen1, ln(.4) - pen1],
                                                        abs=1e-5)
    # the running scores are not penalised
    assert beam.scores.tolist() == pytest.approx([ln(.6), ln(.4)], abs=1e-6)
    # step 2: A -> </s> .6 * .7 = .42, B -> </s> .4 * .9 = .36, AA .18, BA .04
    #         coverage A</s> = [.9 + .05, .1 + .05] = [.95 .15]:
    #           penalty -(ln .95 + ln .15) = 0.0512933 + 1.8971200 = 1.9484133
    #         coverage B</s> = [.9 + .1, .1 + .9] = [1 1]: penalty 0
    beam.advance(log_probs({EOS: .7, A: .3}, {EOS: .9, A: .1}),
                 attention([.05, .05], [.1, .9]))
    assert beam.get_current_origin().tolist() == [0, 1]
    assert beam.get_current_state().tolist() == [EOS, EOS]
    assert_rows(beam.coverage, [[.95, .15], [1.0, 1.0]])
    pen_a = -(ln(.95) + ln(.15))
    assert beam.all_scores[1].tolist() == pytest.approx([ln(.42) - pen_a, ln(.36)], abs=1e-5)
    assert beam.done()
    # ln .42 - 1.9484 = -2.8159 < ln .36 = -1.0217: B</s> ranks first
    scores, ks = beam.sort_finished()
    assert ks == [(2, 1), (2, 0)]
    assert scores == pytest.approx([ln(.36), ln(.42) - pen_a], abs=1e-5)


def test_summary_coverage_penalty_reranks_finished():
    scorer = GNMTGlobalScorer(beta=2.0, coverage_penalty="summary")
    beam = make_beam(2, global_scorer=scorer)
    # step 1: coverage [.7 .3]: 2 * ((1 + 1) - 2) = 0
    beam.advance(log_probs({A: .6, B: .4}, {A: 1.0}), attention([.7, .3], [.5, .5]))
    assert beam.all_scores[0].tolist() == pytest.approx([ln(.6), ln(.4)], abs=1e-6)
    # step 2: A</s> .42 with coverage [.7 + .6, .3 + .4] = [1.3 .7]:
    #           2 * ((1.3 + 1) - 2) = 0.6 -> ln .42 - .6 = -1.4675
    #         B</s> .36 with coverage [.7 + .2, .3 + .8] = [.9 1.1]:
    #           2 * ((1 + 1.1) - 2) = 0.2 -> ln .36 - .2 = -1.2217
    beam.advance(log_probs({EOS: .7, A: .3}, {EOS: .9, A: .1}),
                 attention([.6, .4], [.2, .8]))
    assert beam.done()
    assert beam.all_scores[1].tolist() == pytest.approx([ln(.42) - .6, ln(.36) - .2],
                                                        abs=1e-5)
    scores, ks = beam.sort_finished()
    assert ks == [(2, 1), (2, 0)]
    assert scores == pytest.approx([ln(.36) - .2, ln(.42) - .6], abs=1e-5)


def test_coverage_follows_back_pointers():
    scorer = GNMTGlobalScorer(beta=1.0, coverage_penalty="wu")
    beam = make_beam(2, global_scorer=scorer)
    # With wu, score - penalty = ln p + sum(ln min(cov, 1)).
    # step 1: A .6, B .4, both from row 0: coverage [.5 .5] for both
    beam.advance(log_probs({A: .6, B: .4}, {A: 1.0}), attention([.5, .5], [.5, .5]))
    # step 2: AB .6 * .55 = .33, AA .27; BA .4 * .9 = .36, BB .04
    #         -> [BA, AB] from [1, 0]; BA gets row 1's [.3 .3], AB row 0's [.4 .1]
    #         coverage BA [.8 .8], AB [.9 .6]
    beam.advance(log_probs({B: .55, A: .45}, {A: .9, B: .1}),
                 attention([.4, .1], [.3, .3]))
    assert beam.get_current_origin().tolist() == [1, 0]
    assert_rows(beam.coverage, [[.8, .8], [.9, .6]])
    assert beam.all_scores[1].tolist() == pytest.approx(
        [ln(.36) + 2 * ln(.8), ln(.33) + ln(.9) + ln(.6)], abs=1e-5)
    # step 3: BA -> A .36 * .7 = .252, BA -> </s> .108; AB -> </s> .33 * .9 = .297, ABA .033
    #         -> [AB</s>, BAA] from [1, 0]
    #         AB</s>: AB's [.9 .6] + row 1's [.1 .2] = [1.0 .8]: penalty -ln .8 = .2231436
    #         BAA:    BA's [.8 .8] + row 0's [.2 .1] = [1.0 .9]: penalty -ln .9 = .1053605
    beam.advance(log_probs({A: .7, EOS: .3}, {EOS: .9, A: .1}),
                 attention([.2, .1], [.1, .2]))
    assert beam.get_current_origin().tolist() == [1, 0]
    assert beam.get_current_state().tolist() == [EOS, A]
    assert_rows(beam.coverage, [[1.0, .8], [1.0, .9]])
    assert beam.all_scores[2].tolist() == pytest.approx([ln(.297) + ln(.8), ln(.252) + ln(.9)],
                                                        abs=1e-5)
    assert beam.done()
    assert beam.finished[0][0] == pytest.approx(ln(.297) + ln(.8), abs=1e-5)  # -1.4370682


# -- n-gram blocking --------------------------------------------------------------------------
# Beam 2, four steps; the hypotheses swap slots at step 3, so the n-grams each one has seen
# must follow the back-pointers. Without blocking the last step picks BABA / ABAB.
ALTERNATING_STEPS = [
    # step 1: A .5, B .4
    log_probs({A: .5, B: .4, EOS: .1}, {A: 1.0}),
    # step 2: AB .5 * .6 = .30, AA .15, A</s> .05; BA .4 * .7 = .28, BB .08, B</s> .04
    #         -> [AB, BA] from [0, 1]
    log_probs({B: .6, A: .3, EOS: .1}, {A: .7, B: .2, EOS: .1}),
    # step 3: ABA .30 * .9 = .27, AB</s> .03; BAB .28 * .98 = .2744, BA</s> .0056
    #         -> [BAB, ABA] from [1, 0]
    log_probs({A: .9, EOS: .1}, {B: .98, EOS: .02}),
    # step 4: BABA .2744 * .8 = .21952, BAB</s> .2744 * .2 = .05488;
    #         ABAB .27 * .8 = .216, ABA</s> .27 * .15 = .0405, ABAA .0135
    log_probs({A: .8, EOS: .2}, {B: .8, EOS: .15, A: .05}),
]


def _run(beam, steps):
    for table in steps:
        beam.advance(table, flat_attention(beam.size))
    return beam


def test_without_blocking_the_bigram_repeats():
    beam = _run(make_beam(2), ALTERNATING_STEPS)
    assert [p.tolist() for p in beam.prev_ks] == [[0, 0], [0, 1], [1, 0], [0, 1]]
    # BABA .21952 (from 0), ABAB .216 (from 1)
    assert beam.get_current_state().tolist() == [A, B]
    assert beam.get_hyp(4, 0)[0] == [B, A, B, A]
    assert beam.get_hyp(4, 1)[0] == [A, B, A, B]


def test_block_ngram_repeat_forbids_a_repeated_bigram():
    beam = _run(make_beam(2, block_ngram_repeat=2), ALTERNATING_STEPS)
    # BAB (slot 0, was slot 1 at step 2) already holds "B A": A after B is blocked
    # (BABA .21952 out); ABA (slot 1, was slot 0) already holds "A B": B after A is blocked
    # (ABAB .216 out). Left: BAB</s> .05488 (from 0), ABA</s> .0405 (from 1), ABAA .0135
    assert [p.tolist() for p in beam.prev_ks] == [[0, 0], [0, 1], [1, 0], [0, 1]]
    assert beam.get_current_state().tolist() == [EOS, EOS]
    assert beam.done()
    scores, ks = beam.sort_finished()
    assert ks == [(4, 0), (4, 1)]
    assert scores == pytest.approx([ln(.05488), ln(.0405)], abs=1e-5)
    assert [beam.get_hyp(t, k)[0] for t, k in ks] == [[B, A, B, EOS], [A, B, A, EOS]]


def test_exclusion_tokens_are_exempt_from_blocking():
    # no bigram containing B is recorded: "A B" and "B A" are never forbidden
    beam = _run(make_beam(2, block_ngram_repeat=2, exclusion_tokens=frozenset({B})),
                ALTERNATING_STEPS)
    assert beam.get_current_origin().tolist() == [0, 1]
    assert beam.get_current_state().tolist() == [A, B]  # BABA .21952, ABAB .216
    assert beam.all_scores[3].tolist() == pytest.approx([ln(.21952), ln(.216)], abs=1e-5)


def test_blocked_token_gets_blocked_score():
    beam = make_beam(2, block_ngram_repeat=2)
    # step 1: A .6, B .4; step 2: AA .6, BB .4 (the only finite candidates)
    beam.advance(log_probs({A: .6, B: .4}, {A: 1.0}), flat_attention(2))
    beam.advance(log_probs({A: 1.0}, {B: 1.0}), flat_attention(2))
    assert beam.get_current_state().tolist() == [A, B]
    # step 3: AAA repeats "A A" and BBB repeats "B B": both get -10e20 (the only finite
    # candidates left, so they are still the top 2, with the blocked score)
    beam.advance(log_probs({A: 1.0}, {B: 1.0}), flat_attention(2))
    assert BLOCKED_SCORE == -10e20
    assert beam.all_scores[2].tolist() == pytest.approx([-10e20, -10e20], rel=1e-6)
