"""Search and the translator loop."""
from onmt_lite.translate.beam import Beam
from onmt_lite.translate.global_scorer import GNMTGlobalScorer
from onmt_lite.translate.translation import Translation
from onmt_lite.translate.translator import DecodingOptions, Translator, build_translator

__all__ = ["Beam", "GNMTGlobalScorer", "DecodingOptions", "Translator", "Translation",
           "build_translator"]
