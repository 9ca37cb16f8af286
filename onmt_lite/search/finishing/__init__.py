"""Finishing rules: how candidates are ranked, which end, which go on, and when a sentence is done.

Both rules keep ``k`` running hypotheses per sentence, rows sentence-major (row = i * k + j).

- ``OnmtSlots`` (OpenNMT-py): the ``k`` best candidates by length-penalised score all stay; one
  that ends in ``</s>`` is recorded and holds its slot for that step. A sentence is done when
  its top candidate ends and ``n_best`` hypotheses are finished.
- ``RefillBeams`` (Hugging Face ``generate``): ranks by summed log-probability, takes 2k
  candidates; an ending candidate among the first k enters a k-slot finished list (score
  divided by generated length ** alpha, ``</s>`` counted); the k best non-ending candidates run
  on. ``early_stopping``: ``true`` stops when k hypotheses are finished; ``false`` when the best
  running hypothesis, normalised by the current length, cannot beat the worst finished one;
  ``never`` the same bound at ``max_length`` when alpha > 0.
"""
from onmt_lite.search.finishing.common import CandidatePath, Hypothesis
from onmt_lite.search.finishing.ctranslate2 import CT2_PENALISED, ReplaceFinished
from onmt_lite.search.finishing.fairseq import DiverseGroups, FirstFinished
from onmt_lite.search.finishing.hf import EARLY_STOPPING, HF_EXCLUDED, RefillBeams
from onmt_lite.search.finishing.onmt import OnmtSlots
from onmt_lite.search.finishing.tensorflow import TF_INF, AliveFinished

__all__ = ["AliveFinished", "CT2_PENALISED", "CandidatePath", "DiverseGroups", "EARLY_STOPPING",
           "FirstFinished", "HF_EXCLUDED", "Hypothesis", "OnmtSlots", "RefillBeams",
           "ReplaceFinished", "TF_INF"]
