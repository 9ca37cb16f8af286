"""onmt_lite: a small OpenNMT-style beam-search translator."""
from onmt_lite.translate import Beam, GNMTGlobalScorer, Translator, build_translator

__all__ = ["Beam", "GNMTGlobalScorer", "Translator", "build_translator"]
