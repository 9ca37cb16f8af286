"""Compares onmt_lite's default search (-search onmt) with OpenNMT-py 3.5.1's n-best lists as
make_onmt_py_hunt.py records them: every hypothesis's tokens, in order, and its score within
hunt_search.SCORE_TOL (or float32's precision of a large score). Used by
tests/test_onmt_py_hunt.py and, with onmt_lite's python, as

    python tests/reference/hunt_compare.py REFERENCE.json

which prints a table (setting, model, lines, identical share, differences) and exits 1 where a
line differs for no named reason.

A line counts as identical, or as one of these named cases (each checked, never assumed):

- ``dropped``: an empty line, which OpenNMT-py drops (onmt_lite gives an empty hypothesis);
- ``table bug``: with -block_ngram_repeat in a batch where sentences finish at different steps,
  OpenNMT-py does not reorder its n-gram tables when a sentence leaves the batch (docs/onmt-py.md);
  the line must then be what onmt_lite gives with that bug reproduced (tests/parity.py);
- ``spaces``: a line with two spaces in a row (or a space at either end), which OpenNMT-py
  splits on single spaces (text_corpus.py: ``example["src"].strip().split(" ")``), so that an
  empty token (``<unk>``) stands between the two spaces, where onmt_lite splits on whitespace;
  the line must then be identical with that token written as ``<unk>``;
- ``tie``: the first hypotheses that differ score within FLOAT_TIE of each other (their order
  is float32 rounding; scores are otherwise compared within hunt_search's SCORE_TOL, or
  RELATIVE_TOL of a large score); or candidates with exactly equal scores meet at the beam's
  boundary, and the default selection (candidates.py top_candidates, which ranks the k best
  groups of tokens first) keeps
  another of them than ``torch.topk`` over all rows x V does (OpenNMT-py's beam_search.py
  ``_pick``). Neither order is a rule: equal scores make it a coin toss. The line must then be
  identical when onmt_lite's candidates are chosen by ``torch.topk`` over rows x V, and a tie
  must be measured at the boundary (the k-th and the next candidate's scores, printed); or
  the line's own search meets a boundary gap below FLOAT_TIE at some step (measured on its
  rows, printed): two candidates that differ by float32 rounding only, whose order depends on
  the order of the additions and divisions (onmt_lite adds the running score and divides by
  the length penalty in place; OpenNMT-py makes new tensors) and on the batch's float sums.

OpenNMT-py's -block_ngram_repeat 1 blocks nothing (its table is keyed by the whole hypothesis),
where onmt_lite blocks every repeated token (docs/onmt-py.md): those settings are compared with
onmt_lite's -block_ngram_repeat 0, which must give OpenNMT-py's output.
"""
import json
import math
import os
import sys
import tempfile
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [p for p in (HERE, ROOT, os.path.join(ROOT, "tests")) if p not in sys.path]

from hunt_search import TIE, LineGaps, same_hypothesis  # noqa: E402

SHARED = os.path.join(ROOT, "..", "shared")
FIXTURES = os.path.join(SHARED, "fixtures", "onmt-py")
DECODING_ONLY = ("batch_size", "batch_type", "tgt")
FLOAT_TIE = TIE  # a boundary gap below this is float32 rounding (tests/parity.py's TIE)


def available() -> bool:
    return os.path.isfile(os.path.join(FIXTURES, "transformer.pt"))


def write_models(digests: Dict[str, str], work: str) -> Dict[str, str]:
    """Writes the reference's models into ``work``; refuses a model that is not the one the
    reference was made with (a torch whose seeded generator draws otherwise)."""
    from hunt_variant import write_hunt_variant
    paths = {}
    for name, expected in digests.items():
        fixture, kind = name.split(" ", 1)
        paths[name] = os.path.join(work, f"{fixture}-{kind.replace(' ', '-')}.pt")
        got = write_hunt_variant(os.path.join(FIXTURES, f"{fixture}.pt"), paths[name], kind)
        if got != expected:
            raise RuntimeError(f"{name}: the variant's weights differ from the reference's "
                               f"({got} != {expected})")
    return paths


class Models:
    """onmt_lite translators of the reference's models, loaded once each."""

    def __init__(self, paths: Dict[str, str]):
        self.paths, self.base = paths, {}

    def translator(self, model: str, options: dict, blocking_bug: bool = False,
                   exact_gaps=None):
        from onmt_lite.translate import DecodingOptions, Translator, build_translator
        if model not in self.base:
            self.base[model] = build_translator({"model": self.paths[model]})
        base = self.base[model]
        values = {k: v for k, v in options.items() if k not in DECODING_ONLY}
        if str(options.get("tgt", "")).startswith("prefix"):
            values["tgt_file_prefix"] = True
        if blocking_bug:
            values["beam_engine"] = "sentence"
        translator = Translator(base.model, base.src_vocab, base.tgt_vocab,
                                DecodingOptions(**values), model_max_src_len=base.model_max_src_len,
                                transform=base.transform)
        if blocking_bug:
            import parity
            translator = parity.buggy_blocking_translator(translator)
        if exact_gaps is not None:
            translator = exact_topk(translator, exact_gaps)
        return translator


def exact_topk(translator, gaps):
    """``translator`` choosing its candidates by ``torch.topk`` over rows x V, as OpenNMT-py
    does, recording the boundary gaps (the k-th candidate's score less the next one's): every
    pair in ``boundary``, and each line's own in ``gaps`` (a hunt_search.LineGaps)."""
    from onmt_lite.search import presets
    from onmt_lite.search.candidates import TopK

    class ExactTopK(TopK):
        def pick(self, scores, k):
            flat = scores.reshape(scores.size(0), -1)
            if flat.size(1) > k:  # a call of its own: topk(k + 1) may order equal values otherwise
                edge = flat.topk(k + 1, dim=1).values
                translator.boundary.extend(zip(edge[:, k - 1].tolist(), edge[:, k].tolist()))
                gaps.record(edge, k - 1)
            return flat.topk(k, dim=1)

    class Exact(type(translator)):
        def _translate_batch(self, *args, **kwargs):
            real = presets.TopK
            presets.TopK = ExactTopK
            try:
                return super()._translate_batch(*args, **kwargs)
            finally:
                presets.TopK = real

    translator.__class__ = Exact
    translator.boundary = []
    return translator


def _translate(translator, case: dict) -> list:
    options = case["options"]
    return translator.translate(case["src"], case["tgt"], batch_size=options.get("batch_size", 30),
                                batch_type=options.get("batch_type", "sents"))


def nbest_of(translation) -> List[list]:
    return [[" ".join(p), s] for p, s in zip(translation.preds, translation.scores)]


def same(ours: List[list], theirs: List[list]) -> bool:
    return len(ours) == len(theirs) and all(same_hypothesis(a, b) for a, b in zip(ours, theirs))


def float_tie(ours: List[list], theirs: List[list]) -> Optional[list]:
    """The first hypotheses that differ, where their scores are within FLOAT_TIE (two
    hypotheses whose order is float32 rounding); None otherwise."""
    pairs = [(a, b) for a, b in zip(ours, theirs) if not same_hypothesis(a, b)]
    if len(ours) == len(theirs) and pairs and abs(pairs[0][0][1] - pairs[0][1][1]) <= FLOAT_TIE:
        return list(pairs[0])
    return None


def compare_case(case: dict, models: Models) -> dict:
    """One (setting, model): counts and the lines that differ, with both n-best lists."""
    options = dict(case["options"])
    if options.get("block_ngram_repeat") == 1:  # OpenNMT-py's blocks nothing (see above)
        options["block_ngram_repeat"] = 0
    run = dict(case, options=options)
    ours = _translate(models.translator(case["model"], options), run)
    theirs = iter(case["nbest"])
    report = {"setting": case["setting"], "model": case["model"], "lines": 0, "identical": 0,
              "dropped": 0, "table bug": 0, "spaces": 0, "tie": 0, "differences": []}
    suspects = []
    for index, (src, translation) in enumerate(zip(case["src"], ours)):
        if not src.split():
            report["dropped"] += 1
            assert translation.preds == [[]] * options.get("n_best", 1)
            continue
        report["lines"] += 1
        reference = next(theirs)
        if same(nbest_of(translation), reference):
            report["identical"] += 1
        else:
            suspects.append((index, src, nbest_of(translation), reference))
    assert next(theirs, None) is None, "more OpenNMT-py lines than non-empty source lines"
    buggy = exact = None
    if suspects and options.get("block_ngram_repeat", 0) > 1 and options.get("batch_size", 30) > 1:
        buggy = _translate(models.translator(case["model"], options, blocking_bug=True), run)
    for index, src, mine, reference in suspects:
        if "  " in src.strip():
            tokens = " ".join(t or "<unk>" for t in src.strip().split(" "))
            alone = dict(run, src=[tokens], tgt=None if run["tgt"] is None else [run["tgt"][index]],
                         options=dict(options, batch_size=1))
            if same(nbest_of(_translate(models.translator(case["model"], options), alone)[0]),
                    reference):
                report["spaces"] += 1
                continue
        parted = float_tie(mine, reference)
        if parted is not None:
            report["tie"] += 1
            report.setdefault("ties", []).append({"line": index, "src": src,
                                                  "first that differ (onmt_lite, OpenNMT-py)":
                                                  parted})
            continue
        if exact is None:
            with LineGaps() as gaps:
                translator = models.translator(case["model"], options, exact_gaps=gaps)
                exact = _translate(translator, run)
            ties = [pair for pair in translator.boundary if pair[0] == pair[1]]
        if ties and same(nbest_of(exact[index]), reference):
            report["tie"] += 1
            report.setdefault("ties", []).append({
                "line": index, "src": src, "boundary ties in the case": len(ties),
                "a tie (k-th, next)": ties[0], "onmt_lite": mine[0], "opennmt-py": reference[0]})
        elif gaps.gaps.get(index, math.inf) < FLOAT_TIE:
            report["tie"] += 1
            report.setdefault("ties", []).append({
                "line": index, "src": src, "boundary gap of the line": gaps.gaps[index],
                "onmt_lite": mine[0], "opennmt-py": reference[0]})
        elif buggy is not None and same(nbest_of(buggy[index]), reference):
            report["table bug"] += 1
        else:
            report["differences"].append({"line": index, "src": src, "onmt_lite": mine,
                                          "opennmt-py": reference})
    return report


def run(reference: dict, work: Optional[str] = None, only=None) -> List[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        models = Models(write_models(reference["digests"], work or tmp))
        return [compare_case(case, models) for case in reference["cases"]
                if only is None or only(case)]


def table(reports: List[dict]) -> str:
    rows = ["| setting | model | lines | identical | differences | named |", "|---|---|---|---|---|---|"]
    for r in reports:
        named = ", ".join(f"{r[k]} {k}" for k in ("dropped", "table bug", "spaces", "tie") if r[k])
        rows.append(f"| {r['setting']} | {r['model']} | {r['lines']} | "
                    f"{r['identical'] / max(r['lines'], 1):.1%} | {len(r['differences'])} | "
                    f"{named} |")
    total = sum(r["lines"] for r in reports)
    identical = sum(r["identical"] for r in reports)
    rows.append(f"| all | | {total} | {identical / max(total, 1):.2%} | "
                f"{sum(len(r['differences']) for r in reports)} | |")
    return "\n".join(rows)


def main(path: str) -> int:
    import torch
    torch.set_num_threads(int(os.environ.get("HUNT_THREADS", "2")))
    with open(path, encoding="utf-8") as f:
        reference = json.load(f)
    reports = run(reference)
    print(table(reports))
    for r in reports:
        for d in r["differences"][:3]:
            print(json.dumps({"setting": r["setting"], "model": r["model"], **d},
                             ensure_ascii=False))
    return 1 if any(r["differences"] for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
