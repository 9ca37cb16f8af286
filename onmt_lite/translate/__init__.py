"""The translator: files and lines in, translations out."""
from onmt_lite.search.beam import Beam
from onmt_lite.search.global_scorer import GNMTGlobalScorer
from onmt_lite.translate.translation import Translation
from onmt_lite.translate.translator import DecodingOptions, Translator, build_translator

__all__ = ["Beam", "GNMTGlobalScorer", "DecodingOptions", "Translator", "Translation",
           "build_translator"]
