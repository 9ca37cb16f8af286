"""onmt_lite's default search against OpenNMT-py 3.5.1 over a sweep of its decoding settings, on
its two fixtures and on variants made to misbehave (never ends, ends at once, weights redrawn,
exact ties in the generator): every n-best hypothesis the same, in the same order, scores within
1e-4 (tests/reference/onmt_py_hunt.json, made by tests/reference/make_onmt_py_hunt.py; the
comparison and its named cases are tests/reference/hunt_compare.py's).
"""
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
import hunt_compare  # noqa: E402

with open(os.path.join(ROOT, "tests", "reference", "onmt_py_hunt.json"), encoding="utf-8") as f:
    REFERENCE = json.load(f)
SETTINGS = list(dict.fromkeys(case["setting"] for case in REFERENCE["cases"]))

pytestmark = pytest.mark.skipif(not hunt_compare.available(),
                                reason="../shared/fixtures/onmt-py is absent")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    work = tmp_path_factory.mktemp("hunt_models")
    return hunt_compare.Models(hunt_compare.write_models(REFERENCE["digests"], str(work)))


@pytest.mark.parametrize("setting", SETTINGS)
def test_every_hypothesis_is_opennmt_pys(setting, models):
    for case in (c for c in REFERENCE["cases"] if c["setting"] == setting):
        report = hunt_compare.compare_case(case, models)
        assert report["differences"] == [], (case["model"], report["differences"][:2])
        assert sum(report[k] for k in ("identical", "table bug", "spaces", "tie")) == report["lines"] > 0


def test_the_reference_covers_the_sweep():
    cases = REFERENCE["cases"]
    assert {c["model"] for c in cases} == set(REFERENCE["digests"]) and len(REFERENCE["digests"]) == 10
    beams = {c["options"].get("beam_size") for c in cases}
    assert min(beams) == 1 and max(beams) == 12
    assert any(not line for c in cases for line in c["src"])
    assert any(len(line.split()) == 1 for c in cases for line in c["src"])
    assert max(len(line.split()) for c in cases for line in c["src"]) > 40
