"""GNMTGlobalScorer: each penalty against a hand computation.

Lengths count <s> and </s>: a hypothesis of n words has L = n + 2.
"""
import math

import pytest
import torch

from onmt_lite.search.global_scorer import GNMTGlobalScorer

torch.set_num_threads(1)


# -- length penalties -------------------------------------------------------------------------
@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
@pytest.mark.parametrize("length", [1, 2, 7])
def test_length_penalty_none_is_one(alpha, length):
    scorer = GNMTGlobalScorer(alpha=alpha, length_penalty="none")
    assert scorer.length_penalty(length) == 1.0


@pytest.mark.parametrize("alpha, length, expected", [
    (1.0, 7, 7.0),     # 7 ** 1
    (0.5, 4, 2.0),     # 4 ** 0.5
    (2.0, 3, 9.0),     # 3 ** 2
    (0.0, 5, 1.0),     # 5 ** 0
])
def test_length_penalty_avg(alpha, length, expected):
    scorer = GNMTGlobalScorer(alpha=alpha, length_penalty="avg")
    assert scorer.length_penalty(length) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("alpha, length, expected", [
    (1.0, 7, 2.0),       # (5 + 7) / 6 = 2, ** 1
    (0.5, 19, 2.0),      # (5 + 19) / 6 = 4, ** 0.5 = 2
    (2.0, 1, 1.0),       # (5 + 1) / 6 = 1, ** 2
    (2.0, 4, 2.25),      # (5 + 4) / 6 = 1.5, ** 2 = 2.25
    (0.0, 9, 1.0),       # anything ** 0
])
def test_length_penalty_wu(alpha, length, expected):
    scorer = GNMTGlobalScorer(alpha=alpha, length_penalty="wu")
    assert scorer.length_penalty(length) == pytest.approx(expected, abs=1e-12)


# -- coverage penalties -----------------------------------------------------------------------
def test_coverage_penalty_wu():
    scorer = GNMTGlobalScorer(beta=0.5, coverage_penalty="wu")
    cov = torch.tensor([[0.5, 2.0, 0.25],
                        [1.0, 1.0, 3.0]])
    # row 0: min(cov, 1) = [.5, 1, .25]; -log -> ln2 + 0 + 2 ln2 = 3 ln2; * beta .5 = 1.5 ln2
    # row 1: min(cov, 1) = [1, 1, 1]; -log -> 0
    expected = [1.5 * math.log(2.0), 0.0]
    assert scorer.cov_penalty(cov).tolist() == pytest.approx(expected, abs=1e-6)


def test_coverage_penalty_wu_one_dimensional():
    scorer = GNMTGlobalScorer(beta=1.0, coverage_penalty="wu")
    # -(log .5 + log .5) = 2 ln2 = 1.386294...
    assert float(scorer.cov_penalty(torch.tensor([0.5, 0.5]))) == pytest.approx(
        2 * math.log(2.0), abs=1e-6)


def test_coverage_penalty_summary():
    scorer = GNMTGlobalScorer(beta=2.0, coverage_penalty="summary")
    cov = torch.tensor([[0.5, 2.0, 1.5],
                        [0.2, 0.3, 0.9]])
    # row 0: max(cov, 1) = [1, 2, 1.5], sum 4.5, minus 3 positions = 1.5; * beta 2 = 3.0
    # row 1: max(cov, 1) = [1, 1, 1], sum 3, minus 3 = 0
    assert scorer.cov_penalty(cov).tolist() == pytest.approx([3.0, 0.0], abs=1e-6)


def test_coverage_penalty_none_is_zeros():
    scorer = GNMTGlobalScorer(beta=5.0, coverage_penalty="none")
    penalty = scorer.cov_penalty(torch.tensor([[0.5, 2.0, 1.5], [3.0, 0.0, 0.1]]))
    assert penalty.shape == (2,)
    assert penalty.tolist() == [0.0, 0.0]
    assert not scorer.has_cov_pen


@pytest.mark.parametrize("name", ["wu", "summary"])
def test_has_cov_pen(name):
    assert GNMTGlobalScorer(coverage_penalty=name).has_cov_pen


# -- score() --------------------------------------------------------------------------------
def test_score_length_penalty_only():
    scorer = GNMTGlobalScorer(alpha=1.0, length_penalty="avg")
    # -6 / 4 ** 1 = -1.5
    assert scorer.score(-6.0, 4) == pytest.approx(-1.5, abs=1e-12)


def test_score_wu_length_penalty():
    scorer = GNMTGlobalScorer(alpha=2.0, length_penalty="wu")
    # L = 4: ((5 + 4) / 6) ** 2 = 2.25; -4.5 / 2.25 = -2
    assert scorer.score(-4.5, 4) == pytest.approx(-2.0, abs=1e-12)


def test_score_combines_length_and_coverage():
    scorer = GNMTGlobalScorer(alpha=1.0, beta=2.0, length_penalty="avg",
                              coverage_penalty="summary")
    cov = torch.tensor([0.5, 2.0, 1.5])
    # length: -6 / 4 = -1.5; coverage: 2 * ((1 + 2 + 1.5) - 3) = 3.0; -1.5 - 3.0 = -4.5
    assert scorer.score(-6.0, 4, cov) == pytest.approx(-4.5, abs=1e-6)
    # without coverage only the length penalty applies
    assert scorer.score(-6.0, 4) == pytest.approx(-1.5, abs=1e-12)


def test_score_wu_coverage():
    scorer = GNMTGlobalScorer(beta=1.0, length_penalty="none", coverage_penalty="wu")
    cov = torch.tensor([0.5, 0.25])
    # -3 / 1 - (-(log .5 + log .25)) = -3 - 3 ln2 = -5.0794415...
    assert scorer.score(-3.0, 5, cov) == pytest.approx(-3.0 - 3 * math.log(2.0), abs=1e-6)


def test_score_ignores_coverage_when_penalty_none():
    scorer = GNMTGlobalScorer(alpha=1.0, beta=2.0, length_penalty="avg",
                              coverage_penalty="none")
    # -6 / 3 = -2; coverage has no effect
    assert scorer.score(-6.0, 3, torch.tensor([5.0, 0.1])) == pytest.approx(-2.0, abs=1e-12)


def test_score_none_is_raw_log_prob():
    assert GNMTGlobalScorer().score(-2.5, 9) == -2.5


# -- invalid names ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["average", "WU", "", "gnmt"])
def test_invalid_length_penalty_raises(name):
    with pytest.raises(ValueError, match="length_penalty"):
        GNMTGlobalScorer(length_penalty=name)


@pytest.mark.parametrize("name", ["sum", "Summary", "", "avg"])
def test_invalid_coverage_penalty_raises(name):
    with pytest.raises(ValueError, match="coverage_penalty"):
        GNMTGlobalScorer(coverage_penalty=name)
