"""onmt_lite: a small OpenNMT-style beam-search translator."""
import os

# OpenMP threads that spin while they wait take the cores other programs need, and on a shared
# CPU a translation then runs many times slower (benchmarks/threads_bench.py). OpenMP reads this
# once, when torch loads it: it must be set before torch is imported. A value already set wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__all__ = ["Beam", "GNMTGlobalScorer", "Translator", "build_translator"]


def __getattr__(name: str):
    """The translator's names, imported at first use: a program that never translates (the
    server's own process, ``evaluate``) never loads torch."""
    if name in __all__:
        import onmt_lite.translate
        return getattr(onmt_lite.translate, name)
    raise AttributeError(f"module 'onmt_lite' has no attribute {name!r}")
