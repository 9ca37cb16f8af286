"""The translator: files and lines in, translations out."""
from onmt_lite.search.beam import Beam
from onmt_lite.search.global_scorer import GNMTGlobalScorer
from onmt_lite.translate.build import build_translator
from onmt_lite.translate.options import DecodingOptions
from onmt_lite.translate.translation import Translation
from onmt_lite.translate.translator import Translator

__all__ = ["Beam", "GNMTGlobalScorer", "DecodingOptions", "Translator", "Translation",
           "build_translator"]
