"""onmt_lite: a small OpenNMT-style beam-search translator."""
import os

# OpenMP threads that spin while they wait take the cores other programs need, and on a shared
# CPU a translation then runs many times slower (benchmarks/threads_bench.py). OpenMP reads this
# once, when torch loads it: it must be set before torch is imported. A value already set wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from onmt_lite.translate import Beam, GNMTGlobalScorer, Translator, build_translator  # noqa: E402

__all__ = ["Beam", "GNMTGlobalScorer", "Translator", "build_translator"]
