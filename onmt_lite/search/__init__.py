"""Search: one batched loop driven by processors, a candidate selection and a finishing rule;
presets name each toolkit's choices. ``Beam`` is the per-sentence reference of OpenNMT-py's."""
from onmt_lite.search.beam import Beam
from onmt_lite.search.global_scorer import GNMTGlobalScorer
from onmt_lite.search.presets import PRESETS, build_search

__all__ = ["Beam", "GNMTGlobalScorer", "PRESETS", "build_search"]
