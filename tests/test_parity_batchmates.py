"""One sentence among different batch-mates against OpenNMT-py 3.5.1's own n-best lists
(tests/reference/onmt_py_batchmates.json, made by tests/reference/make_onmt_py_batchmates.py on
the raw-text fixture ../shared/fixtures/onmt-py-spm).

OpenNMT-py finishes a sentence from its own rows only (docs/parity.md): batch-mates reach its
result through the float sums of the batch alone, above all its padded source width. The
reference's sentence meets, at its sixth step, two candidates at the beam's edge less than 1e-6
apart; on the CPU that made the file OpenNMT-py keeps the other one at some widths, and its
n-best search then runs on past the stop it makes at the others. Every line of every batch must
be OpenNMT-py's (the same texts in order, scores within 1e-4), or its own search in onmt_lite
must meet a boundary gap below TIE (measured on its rows of that batch): a tie, named.
"""
import json
import math
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
from hunt_search import TIE, boundary_gaps, same_hypothesis  # noqa: E402

FIXTURE = os.path.join(ROOT, "..", "shared", "fixtures", "onmt-py-spm")
MODEL = os.path.join(FIXTURE, "model.pt")
SPM = os.path.join(FIXTURE, "spm.model")
with open(os.path.join(ROOT, "tests", "reference", "onmt_py_batchmates.json"),
          encoding="utf-8") as f:
    REFERENCE = json.load(f)
LINE = REFERENCE["line"]
STOP = ["Ein Mann in einem Neoprenanzug surft im Meer.", "Ein Mann springt in die Luft.",
        "Ein Mann in der Nähe eines Boots."]  # the n-best where the search stops at step 11

pytestmark = pytest.mark.skipif(not os.path.isfile(MODEL),
                                reason="../shared/fixtures/onmt-py-spm is absent")
_translators: dict = {}


def options(case: dict) -> dict:
    return {**case["options"], "transforms": ["sentencepiece"], "src_subword_model": SPM,
            "tgt_subword_model": SPM}


def onmt_lite(case: dict) -> list:
    """[[text, score], ...] per line of the case, decoded as one batch."""
    from onmt_lite.translate.build import build_translator
    key = json.dumps(case["options"], sort_keys=True)
    if key not in _translators:
        _translators[key] = build_translator({"model": MODEL, **options(case)})
    results = _translators[key].translate(case["src"], batch_size=len(case["src"]))
    return [[[text, score] for text, score in zip(r.texts, r.scores)] for r in results]


def differing_lines(case: dict) -> dict:
    """{line: (onmt_lite's n-best, OpenNMT-py's)} where they differ."""
    ours = onmt_lite(case)
    return {i: (a, b) for i, (a, b) in enumerate(zip(ours, case["nbest"]))
            if len(a) != len(b) or not all(same_hypothesis(x, y) for x, y in zip(a, b))}


def assert_opennmt_pys_or_measured_ties(case: dict) -> None:
    differ = differing_lines(case)
    if differ:
        gaps = boundary_gaps(MODEL, case["src"], options(case))
        untied = {i: (case["src"][i], gaps[i], *differ[i]) for i in differ if not gaps[i] < TIE}
        assert untied == {}, f"lines differing without a boundary tie in their search: {untied}"


@pytest.mark.parametrize("case", REFERENCE["batches"],
                         ids=lambda c: f"{c['setting']}, width {c['width']}")
def test_every_line_of_a_batch_of_32_is_opennmt_pys_or_a_measured_tie(case):
    assert len(case["src"]) == 32 and LINE in case["src"]
    assert_opennmt_pys_or_measured_ties(case)


def test_the_sentence_beside_each_source_width_is_opennmt_pys_or_a_measured_tie():
    for case in REFERENCE["widths"]:
        assert_opennmt_pys_or_measured_ties(case)


def test_the_reference_shows_opennmt_py_answering_by_its_batch():
    """The stored file itself: OpenNMT-py gives the sentence two n-best lists, by batch."""
    answers = {}
    for case in REFERENCE["widths"]:
        texts = [text for text, _ in case["nbest"][case["src"].index(LINE)]]
        answers.setdefault(tuple(texts), []).append(case["width"])
    assert STOP in [list(a) for a in answers] and len(answers) == 2, answers
    assert all(len(widths) > 1 for widths in answers.values())


def test_the_sentence_meets_a_tie_at_the_beams_edge():
    """Measured here: its own search, alone, meets a boundary gap below TIE (float32 rounding)."""
    case = REFERENCE["widths"][0]
    gap = boundary_gaps(MODEL, [LINE], options(case))[0]
    assert 0 <= gap < TIE and math.isfinite(gap)
