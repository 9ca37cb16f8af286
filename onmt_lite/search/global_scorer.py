"""GNMTGlobalScorer: length and coverage penalties that rank finished hypotheses.

Lengths count ``<s>`` and ``</s>``, as OpenNMT-py does: a hypothesis of n words has L = n + 2.
"""
import math

import torch

from onmt_lite.errors import OptionError

LENGTH_PENALTIES = ("none", "avg", "wu")
COVERAGE_PENALTIES = ("none", "wu", "summary")


class GNMTGlobalScorer:
    """Scores hypotheses: ``log_prob_sum / length_penalty(L) - coverage_penalty(coverage)``.

    Args:
        alpha: length penalty strength (``avg``: L^alpha; ``wu``: ((5 + L) / 6)^alpha).
        beta: coverage penalty strength (``wu``: beta * sum(-log(min(cov, 1)));
            ``summary``: beta * sum(max(cov, 1) - 1)).
        length_penalty: ``none``, ``avg`` or ``wu``.
        coverage_penalty: ``none``, ``wu`` or ``summary``.
    """

    def __init__(self, alpha: float = 0.0, beta: float = 0.0, length_penalty: str = "none",
                 coverage_penalty: str = "none"):
        if length_penalty not in LENGTH_PENALTIES:
            raise OptionError(f"-length_penalty must be one of {', '.join(LENGTH_PENALTIES)}")
        if coverage_penalty not in COVERAGE_PENALTIES:
            raise OptionError(f"-coverage_penalty must be one of "
                              f"{', '.join(COVERAGE_PENALTIES)}")
        for name, value in (("alpha", alpha), ("beta", beta)):
            if not math.isfinite(value):  # nan or inf would make every score nan
                raise OptionError(f"-{name}: must be a finite number, got {value}")
        self.alpha, self.beta = alpha, beta
        self.length_penalty_name, self.coverage_penalty_name = length_penalty, coverage_penalty
        self.has_cov_pen = coverage_penalty != "none"

    def length_penalty(self, length: int) -> float:
        """The divisor of a summed log-probability of ``length`` tokens."""
        if self.length_penalty_name == "avg":
            return length ** self.alpha
        if self.length_penalty_name == "wu":
            return ((5 + length) / 6.0) ** self.alpha
        return 1.0

    def cov_penalty(self, coverage: torch.Tensor) -> torch.Tensor:
        """(..., src_len) summed attention -> (...) penalty to subtract."""
        if self.coverage_penalty_name == "wu":
            return self.beta * -coverage.clamp(max=1.0).log().sum(-1)
        if self.coverage_penalty_name == "summary":
            return self.beta * (coverage.clamp(min=1.0).sum(-1) - coverage.size(-1))
        return coverage.new_zeros(coverage.shape[:-1])

    def score(self, log_prob_sum: float, length: int, coverage: torch.Tensor = None) -> float:
        """The final score of one hypothesis."""
        penalised = log_prob_sum / self.length_penalty(length)
        if coverage is not None and self.has_cov_pen:
            penalised -= float(self.cov_penalty(coverage))
        return penalised
