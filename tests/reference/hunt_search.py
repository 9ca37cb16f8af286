"""What the fairseq and TensorFlow hunts (hunt_fairseq.py, hunt_tensorflow.py) and the test that
replays their stored references (tests/test_search_hunts.py) share: the models made to misbehave,
onmt_lite's side of a case, and the comparison of two n-best lists.

A line is identical when every hypothesis has the same tokens, in the same order, and its score
within SCORE_TOL (or float32's precision of a large score: RELATIVE_TOL of it, as for the
hundreds of log-probabilities summed by a hypothesis that runs to the length limit). A line
that is not is named a tie only where one is measured:

- ``float tie``: the first hypotheses that differ score within TIE of each other: two
  candidates whose scores agree to float32's last bits, summed in other orders by the two
  toolkits (their batches differ in shape), may come in either order;
- ``boundary tie``: at some step of the search of the line's batch, the last candidate kept and
  the first one dropped (of the 2k candidates, of the first k within them, or of any other
  top-k the search takes, such as each diverse group's) score within TIE of each other, or
  within the line's measured float noise where that is larger (how far its batch moves its
  hypotheses' scores: the same hypothesis decoded in the batch and alone), measured on the
  line's own rows by decoding the batch again, recording each step's gaps: which of the two
  survives is float32 rounding, and all that follows differs;
- ``twins``: on the model whose generator gives every word from hunt_variant.TIES_FROM on the
  same row, the first hypotheses that differ part at two such words (exactly equal
  log-probabilities: which of them ``topk`` keeps depends on the layout of the whole row).

Anything else is a difference, printed with both n-best lists.
"""
import os
import sys
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [p for p in (HERE, ROOT) if p not in sys.path]

from hunt_variant import KINDS, TIES_FROM, write_hunt_variant  # noqa: E402

FIXTURES = os.path.join(ROOT, "..", "shared", "fixtures", "onmt-py")
MODELS = [f"{fixture} {kind}" for fixture in ("transformer", "rnn") for kind in KINDS]
SCORE_TOL = 1e-4
# float32's precision of a long hypothesis's summed score, across CPUs: the references were
# made on AVX-512, and on AVX2 the products round differently, step after step (an RNN's
# 110-token hypothesis that never ends: 2.1e-6 of its score)
RELATIVE_TOL = 1e-5
TIE = 1e-5


def available() -> bool:
    return os.path.isfile(os.path.join(FIXTURES, "transformer.pt"))


def write_models(work: str, names, expected: Optional[Dict[str, str]] = None):
    """Writes the named variants into ``work``: (paths, digests). Refuses a model whose weights
    are not the ones ``expected`` names (a torch whose seeded generator draws otherwise)."""
    paths, digests = {}, {}
    for name in names:
        fixture, kind = name.split(" ", 1)
        paths[name] = os.path.join(work, f"{fixture}-{kind.replace(' ', '-')}.pt")
        digests[name] = write_hunt_variant(os.path.join(FIXTURES, f"{fixture}.pt"), paths[name],
                                           kind)
        if expected and expected.get(name, digests[name]) != digests[name]:
            raise RuntimeError(f"{name}: the variant's weights differ from the reference's")
    return paths, digests


def onmt_lite_nbest(path: str, src_lines: List[str], options: dict, batch: int,
                    one_batch: bool) -> List[list]:
    """onmt_lite's [[text, score], ...] per line; ``one_batch``: each run of ``batch`` lines is
    decoded as one batch (a toolkit whose stop rule looks at the whole batch)."""
    from onmt_lite.translate import build_translator
    translator = build_translator({"model": path, **options})
    if one_batch:  # the toolkit's batches: runs of the non-empty lines
        lines = [line for line in src_lines if line.split()]
        decoded = []
        for first in range(0, len(lines), batch):
            decoded += translator.translate(lines[first:first + batch], batch_size=batch)
        empty = translator.translate([""])[0]
        decoded = iter(decoded)
        results = [next(decoded) if line.split() else empty for line in src_lines]
    else:
        results = translator.translate(src_lines, batch_size=batch)
    return [[[" ".join(p), s] for p, s in zip(r.preds, r.scores)] for r in results]


class LineGaps:
    """While open, each input line's smallest boundary gap (the last candidate a step keeps less
    the first it drops), from that line's own rows: ``gaps`` maps a line's index in the
    translate call's input to it. Follows each batch's lines (Translator.batch_steps) and which
    line each live row holds (every finishing rule's ``start`` and ``keep``); a search's
    selection reports its edges through ``record``."""

    def __init__(self):
        self.gaps: Dict[int, float] = {}
        self.lines: List[int] = []  # the batch's input lines, in batch order
        self.live: List[int] = []  # the batch position at each live row

    def record(self, edge, last: int) -> None:
        """``edge``: (live rows, >= last + 2) a step's best scores, in order, per row."""
        import math
        if edge.size(0) != len(self.live):
            return  # not one row per sentence (a top-k inside another, of its own rows)
        for row, (a, b) in enumerate(zip(edge[:, last].tolist(), edge[:, last + 1].tolist())):
            line = self.lines[self.live[row]]
            if math.isfinite(b):
                self.gaps[line] = min(self.gaps.get(line, math.inf), a - b)

    def __enter__(self) -> "LineGaps":
        from onmt_lite.search import finishing
        from onmt_lite.translate.translator import Translator
        recorder, steps = self, Translator.batch_steps

        def batch_steps(translator, indices, *args, **kwargs):
            recorder.lines = indices
            return (yield from steps(translator, indices, *args, **kwargs))

        def follow(rule):
            start, keep = rule.start, rule.keep

            def started(r, batch, *args):
                recorder.live = list(range(batch))
                return start(r, batch, *args)

            def kept(r, sentences, rows):
                recorder.live = [recorder.live[i] for i in sentences.tolist()]
                return keep(r, sentences, rows)
            return started, kept

        rules = [c for c in vars(finishing).values() if isinstance(c, type) and "keep" in vars(c)]
        self._restore = [(Translator, "batch_steps", steps)] + [
            (c, name, getattr(c, name)) for c in rules for name in ("start", "keep")]
        Translator.batch_steps = batch_steps
        for c in rules:
            c.start, c.keep = follow(c)
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, value in self._restore:
            setattr(owner, name, value)


def boundary_gaps(path: str, src_lines: List[str], options: dict) -> List[float]:
    """Per line of ``src_lines``, decoded as one batch: the smallest gap, over every step of its
    own search (its rows of each step), between the last candidate the search keeps and the
    first it drops (LineGaps)."""
    import math

    import torch

    from onmt_lite.search import presets
    from onmt_lite.search.candidates import TopK
    assert all(line.split() for line in src_lines), "every line is decoded (none empty)"
    recorder = LineGaps()

    class Measured(TopK):
        def pick(self, scores, k):
            flat = scores.reshape(scores.size(0), -1)
            width = min(self.width_factor * k, flat.size(1))
            edge = real_topk(flat, min(width + 1, flat.size(1)), dim=1).values
            # the 2k candidates' edge, and the beam's within them (fairseq finalizes the ends
            # among the first k, TensorFlow keeps the first k that go on)
            for last in {width - 1, k - 1} & set(range(edge.size(1) - 1)):
                recorder.record(edge, last)
            return super().pick(scores, k)

    def measured_topk(tensor, k, dim=-1, largest=True, sorted=True):
        """Any other top-k of the search (DiverseGroups' per group): its own edge."""
        if largest and tensor.dim() == 2 and dim in (1, -1) and k < tensor.size(1):
            recorder.record(real_topk(tensor, k + 1, dim=1).values, k - 1)
        return real_topk(tensor, k, dim, largest, sorted)

    real, presets.TopK = presets.TopK, Measured
    real_topk, torch.Tensor.topk = torch.Tensor.topk, measured_topk
    try:
        with recorder:
            onmt_lite_nbest(path, src_lines, options, len(src_lines), one_batch=True)
    finally:
        presets.TopK, torch.Tensor.topk = real, real_topk
    return [recorder.gaps.get(i, math.inf) for i in range(len(src_lines))]


def float_noise(path: str, batch: List[str], src: str, options: dict) -> float:
    """How far the float sums of ``src``'s batch move its scores: the largest difference between
    a hypothesis's score decoded in ``batch`` and alone (of the hypotheses both give)."""
    if len(batch) == 1:
        return 0.0
    in_batch = onmt_lite_nbest(path, batch, options, len(batch), one_batch=True)[batch.index(src)]
    alone = dict(onmt_lite_nbest(path, [src], options, 1, one_batch=True)[0])
    return max((abs(score - alone[text]) for text, score in in_batch if text in alone),
               default=0.0)


def padded(src_vocab, lines: List[List[str]]):
    """Token lines -> their ids (B, longest) padded, and their lengths (B,)."""
    import torch
    ids = [src_vocab.encode(line) for line in lines]
    src_len = torch.tensor([len(x) for x in ids])
    src = torch.full((len(ids), int(src_len.max())), src_vocab.pad, dtype=torch.long)
    for row, x in enumerate(ids):
        src[row, :len(x)] = torch.tensor(x)
    return src, src_len


def tied_words(path: str) -> frozenset:
    """The target words the ``ties`` variant gives one generator row."""
    from onmt_lite.checkpoint import load_model
    _, ckpt = load_model(path)
    return frozenset(ckpt.tgt_vocab.itos[TIES_FROM:])


def same_hypothesis(a: list, b: list) -> bool:
    """[text, score] pairs: the same text, scores within SCORE_TOL or float32's precision of a
    large score (RELATIVE_TOL of it)."""
    return a[0] == b[0] and abs(a[1] - b[1]) <= max(SCORE_TOL, RELATIVE_TOL * abs(b[1]))


def classify(ours: List[list], theirs: List[list], twins: frozenset = frozenset()):
    """("identical" | "float tie" | "twins" | "difference", the first hypotheses that differ)."""
    if len(ours) == len(theirs) and all(same_hypothesis(a, b) for a, b in zip(ours, theirs)):
        return "identical", None
    first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if not same_hypothesis(a, b)),
                 min(len(ours), len(theirs)))
    if first == min(len(ours), len(theirs)):  # one list is the other's start
        return "difference", {"rank": first, "onmt_lite": ours[first:first + 1],
                              "theirs": theirs[first:first + 1]}
    a, b = ours[first], theirs[first]
    detail = {"rank": first, "onmt_lite": a, "theirs": b}
    if abs(a[1] - b[1]) <= TIE:
        return "float tie", detail
    words_a, words_b = a[0].split(), b[0].split()
    part = next((i for i, (x, y) in enumerate(zip(words_a, words_b)) if x != y), None)
    if part is not None and words_a[part] in twins and words_b[part] in twins:
        return "twins", dict(detail, words=[words_a[part], words_b[part]])
    return "difference", detail


def compare_case(case: dict, ours: List[list], path: Optional[str] = None) -> dict:
    """One (setting, model): counts per kind and the lines that differ; with the model's
    ``path``, a line that differs is decoded again to measure its boundary gaps."""
    report = {"setting": case["setting"], "model": case["model"], "lines": 0, "identical": 0,
              "float tie": 0, "boundary tie": 0, "twins": 0, "empty": 0, "differences": [],
              "ties": []}
    decoded = [line for line in case["src"] if line.split()]
    twins = case.get("twins", frozenset())
    theirs = iter(case["nbest"])
    for src, mine in zip(case["src"], ours):
        if not src.split():  # not decoded by the toolkit (see each hunt's docstring)
            report["empty"] += 1
            assert all(text == "" for text, _ in mine), mine
            continue
        report["lines"] += 1
        kind, detail = classify(mine, next(theirs), twins)
        if kind == "difference" and path is not None:
            batch = [src]  # a stop rule that looks at the whole batch: the line's own batch
            if case.get("one_batch"):
                first = decoded.index(src) // case["batch"] * case["batch"]
                batch = decoded[first:first + case["batch"]]
            gap = boundary_gaps(path, batch, case["options"])[batch.index(src)]
            noise = float_noise(path, batch, src, case["options"]) if gap >= TIE else 0.0
            if gap < max(TIE, noise):
                kind, detail = "boundary tie", dict(detail, gap=gap, noise=noise)
        if kind == "identical":
            report["identical"] += 1
        elif kind == "difference":
            report["differences"].append({"src": src, **detail})
        else:
            report[kind] += 1
            report["ties"].append({"src": src, "kind": kind, **detail})
    assert next(theirs, None) is None, "more reference lines than non-empty source lines"
    return report


def table(reports: List[dict], toolkit: str) -> str:
    rows = [f"| setting | model | lines | identical | {toolkit} differences | named ties |",
            "|---|---|---|---|---|---|"]
    for r in reports:
        named = ", ".join(f"{r[k]} {k}" for k in ("float tie", "boundary tie", "twins") if r[k])
        rows.append(f"| {r['setting']} | {r['model']} | {r['lines']} | "
                    f"{r['identical'] / max(r['lines'], 1):.1%} | {len(r['differences'])} | "
                    f"{named} |")
    total = sum(r["lines"] for r in reports)
    identical = sum(r["identical"] for r in reports)
    ties = sum(r["float tie"] + r["boundary tie"] + r["twins"] for r in reports)
    rows.append(f"| all ({len(reports)} cases) | | {total} | {identical / max(total, 1):.2%} | "
                f"{sum(len(r['differences']) for r in reports)} | {ties} |")
    return "\n".join(rows)


def run_hunt(doc: str, toolkit: str, name: str, versions: dict, settings, their_nbest) -> None:
    """The command line of a toolkit's hunt: for every setting (name, batch size, onmt_lite
    options, the toolkit's own arguments) and model, the toolkit's n-best lists
    (``their_nbest(model path, lines, arguments, batch size)``, one per non-empty line, in its
    batches of ``batch size``) beside onmt_lite's on the same batches; writes the reference
    (tests/reference/NAME_hunt.json, or with --full a temporary file) and prints the table."""
    import argparse
    import json
    import tempfile
    import time

    import torch
    from hunt_lines import lines_for, read_corpora
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="~100 lines per case; the "
                        "reference goes to a temporary file")
    parser.add_argument("--out", help="where to write the reference")
    parser.add_argument("--settings", help="only the settings whose names contain this")
    parser.add_argument("--models", help="only the models whose names contain this")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("HUNT_THREADS", "2")))
    size = "full" if args.full else "default"
    corpora = read_corpora()
    out = {"made_by": f"tests/reference/hunt_{name}.py", **versions, "torch": torch.__version__,
           "size": size, "digests": {}, "cases": []}
    reports, started = [], time.time()
    with tempfile.TemporaryDirectory() as work:
        models = [m for m in MODELS if not args.models or args.models in m]
        paths, out["digests"] = write_models(work, models)
        twins = {m: tied_words(paths[m]) for m in models if m.endswith("ties")}
        for setting, batch, options, their_args in settings:
            if args.settings and args.settings not in setting:
                continue
            for model in models:
                src = [s for s, _ in lines_for(setting, model, size, corpora)]
                case = {"setting": setting, "model": model, "batch": batch, "one_batch": True,
                        "options": options, "src": src,
                        "nbest": their_nbest(paths[model], src, their_args, batch)}
                out["cases"].append(case)
                ours = onmt_lite_nbest(paths[model], src, options, batch, one_batch=True)
                reports.append(compare_case(dict(case, twins=twins.get(model, ())), ours,
                                            paths[model]))
                r = reports[-1]
                print(f"{time.time() - started:7.1f}s {setting} | {model}: {len(src)} lines, "
                      f"{r['identical']}/{r['lines']} identical, {len(r['ties'])} named ties, "
                      f"{len(r['differences'])} differences", file=sys.stderr, flush=True)
    path = args.out or (os.path.join(tempfile.gettempdir(), f"{name}_hunt_full.json")
                        if args.full else os.path.join(HERE, f"{name}_hunt.json"))
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(table(reports, toolkit))
    for r in reports:
        for d in r["differences"][:3] + r["ties"][:1]:
            print(json.dumps({"setting": r["setting"], "model": r["model"], **d},
                             ensure_ascii=False))
    print(f"wrote {path}", file=sys.stderr)
