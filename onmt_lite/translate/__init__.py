"""The translator: files and lines in, translations out."""
import importlib

# name -> the module that holds it, imported at first use: the modules of this package that need
# no torch (flags, sources, sentences) load without it
_WHERE = {"Beam": "onmt_lite.search.beam", "GNMTGlobalScorer": "onmt_lite.search.global_scorer",
          "build_translator": "onmt_lite.translate.build",
          "DecodingOptions": "onmt_lite.translate.options",
          "Translation": "onmt_lite.translate.translation",
          "Translator": "onmt_lite.translate.translator"}

__all__ = ["Beam", "GNMTGlobalScorer", "DecodingOptions", "Translator", "Translation",
           "build_translator"]


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'onmt_lite.translate' has no attribute {name!r}")
