"""``-search fairseq`` and ``-search tf`` against their toolkits' own searches over a sweep of
settings, on the OpenNMT-py fixtures and on variants made to misbehave (never ends, ends at
once, weights redrawn, tied generator rows): every hypothesis the same, in the same order,
scores within 1e-4, but for the ties that tests/reference/hunt_search.py names and measures.

The references (tests/reference/fairseq_hunt.json, tensorflow_hunt.json) are fairseq's
SequenceGenerator and TensorFlow's official beam search run as they ship in side environments
(hunt_fairseq.py, hunt_tensorflow.py), driving onmt_lite's model of the same weights.
"""
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
import hunt_search  # noqa: E402

REFERENCES = {name: os.path.join(ROOT, "tests", "reference", f"{name}_hunt.json")
              for name in ("fairseq", "tensorflow")}
pytestmark = pytest.mark.skipif(not hunt_search.available(),
                                reason="../shared/fixtures/onmt-py is absent")


def load(name: str) -> dict:
    with open(REFERENCES[name], encoding="utf-8") as f:
        return json.load(f)


# every fourth case by default (each setting with two or three of the ten models, in turn); the
# others with pytest -m slow
CASES = [pytest.param(name, index, id=f"{name}-{index}",
                      marks=() if index % 4 == 0 else pytest.mark.slow)
         for name in REFERENCES if os.path.exists(REFERENCES[name])
         for index in range(len(load(name)["cases"]))]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> (paths of the variants, tied words of the ties variant), per reference."""
    out = {}
    for name in REFERENCES:
        if not os.path.exists(REFERENCES[name]):
            continue
        digests = load(name)["digests"]
        paths, _ = hunt_search.write_models(str(tmp_path_factory.mktemp(name)), digests, digests)
        twins = {m: hunt_search.tied_words(p) for m, p in paths.items() if m.endswith("ties")}
        out[name] = paths, twins
    return out


@pytest.fixture(scope="module")
def references():
    return {name: load(name) for name in REFERENCES if os.path.exists(REFERENCES[name])}


@pytest.mark.parametrize("name, index", CASES)
def test_every_hypothesis_is_the_toolkits(name, index, models, references):
    case = references[name]["cases"][index]
    paths, twins = models[name]
    ours = hunt_search.onmt_lite_nbest(paths[case["model"]], case["src"], case["options"],
                                       case["batch"], case.get("one_batch", False))
    report = hunt_search.compare_case(dict(case, twins=twins.get(case["model"], ())), ours,
                                      paths[case["model"]])
    assert report["differences"] == [], (case["setting"], case["model"], report["differences"])
    named = report["float tie"] + report["boundary tie"] + report["twins"]
    assert report["identical"] + named == report["lines"] > 0


@pytest.mark.parametrize("name", [n for n in REFERENCES if os.path.exists(REFERENCES[n])])
def test_each_reference_covers_the_sweep(name, references):
    cases = references[name]["cases"]
    assert {c["model"] for c in cases} == set(hunt_search.MODELS)
    beams = {c["options"]["beam_size"] for c in cases}
    assert min(beams) == 1 and max(beams) == 12
    assert any(not line for c in cases for line in c["src"])
    assert any(len(line.split()) == 1 for c in cases for line in c["src"])


def test_a_tie_is_named_only_where_measured():
    same = [["ein hund", -1.0], ["ein kind", -1.5]]
    assert hunt_search.classify(same, same)[0] == "identical"
    assert hunt_search.classify([same[0]], [["ein kind", -1.0 - 1e-6]])[0] == "float tie"
    assert hunt_search.classify([same[0]], [["ein kind", -1.2]])[0] == "difference"
    assert hunt_search.classify([same[0]], [["ein kind", -1.2]],
                                frozenset({"hund", "kind"}))[0] == "twins"
    assert hunt_search.classify(same, same[:1])[0] == "difference"


def test_boundary_gaps_are_each_lines_own(tmp_path):
    """A batch's gaps go to the line whose rows met them, through the batch's order by length
    and the sentences that leave it: each line's gap in the batch is its gap alone (within the
    batch's float noise)."""
    paths, _ = hunt_search.write_models(str(tmp_path), ["transformer plain"])
    path = paths["transformer plain"]
    lines = ["a man is riding a bike down the street .", "two dogs .",
             "a woman in a red dress sings on a stage while a band plays behind her .", "a boy ."]
    for options in ({"search": "fairseq", "beam_size": 4}, {"beam_size": 3, "n_best": 2}):
        in_batch = hunt_search.boundary_gaps(path, lines, options)
        alone = [hunt_search.boundary_gaps(path, [line], options)[0] for line in lines]
        assert in_batch == pytest.approx(alone, abs=1e-4), options
        assert len(set(round(g, 3) for g in alone)) > 1  # the lines' gaps differ: a real check
