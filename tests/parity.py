"""Parity with OpenNMT-py 3.5.1 on its own outputs (../shared/fixtures/onmt-py).

Used by tests/test_parity.py (a few batches per case in CI, whole files with ``-m slow``) and
runnable as ``python tests/parity.py [rnn|transformer ...]`` for the full match table.
"""
import json
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(ROOT, "..", "shared")
FIXTURES = os.path.join(SHARED, "fixtures", "onmt-py")
REFS = os.path.join(FIXTURES, "refs", "test_2016_flickr")
TEST_SRC = os.path.join(SHARED, "data", "multi30k", "test_2016_flickr.lc.tok.en")
TEST_TGT = os.path.join(SHARED, "data", "multi30k", "test_2016_flickr.lc.tok.de")
MODELS = ("rnn", "transformer")
# Score gap at the beam boundary below which two candidates are tied to float32 rounding.
TIE = 1e-5


@dataclass
class Case:
    name: str
    options: dict
    src: str = TEST_SRC
    tgt: Optional[str] = None
    patched_for: tuple = ()  # models whose reference comes from the patched OpenNMT-py
    with_score: bool = False
    attn_debug: bool = False
    ref_name: Optional[str] = None  # reference file stem when it differs from the case name
    # (model, line) -> why onmt_lite differs from OpenNMT-py there (a documented bug of theirs)
    divergence: Optional[str] = None
    extra: dict = field(default_factory=dict)

    def ref_path(self, model: str, ext: str) -> str:
        stem = f"{model}.{self.ref_name or self.name}.{ext}"
        if model in self.patched_for:
            return os.path.join(REFS, "patched", stem)
        return os.path.join(REFS, stem)


CASES = [
    Case("greedy", {"beam_size": 1}),
    Case("beam5", {"beam_size": 5}),
    Case("beam5_lpnone", {"beam_size": 5, "length_penalty": "none"}),
    Case("nbest3_noscore", {"beam_size": 5, "n_best": 3}),
    Case("nbest3", {"beam_size": 5, "n_best": 3}, patched_for=MODELS, with_score=True),
    Case("wu_b1", {"beam_size": 5, "length_penalty": "wu", "alpha": 0.6,
                   "coverage_penalty": "wu", "beta": 0.2, "batch_size": 1},
         patched_for=("rnn",)),
    Case("avg_summary", {"beam_size": 5, "length_penalty": "avg", "coverage_penalty": "summary",
                         "beta": 0.3}, patched_for=("rnn",)),
    Case("block2", {"beam_size": 5, "block_ngram_repeat": 2}, divergence="blocking"),
    Case("minmax", {"beam_size": 5, "min_length": 12, "max_length": 20}),
    Case("replace_unk", {"beam_size": 5, "replace_unk": True}, patched_for=("rnn",),
         divergence="replace_unk"),
    Case("beam10_b1", {"beam_size": 10, "batch_size": 1}, src=os.path.join(REFS, "src.first200.en")),
    Case("gold", {"beam_size": 5}, tgt=TEST_TGT),
    Case("attn_debug", {"beam_size": 5}, src=os.path.join(REFS, "src.first20.en"),
         patched_for=("rnn",), attn_debug=True),
]
CASE_BY_NAME = {c.name: c for c in CASES}


def available() -> bool:
    return os.path.isdir(REFS)


def read(path: str) -> List[str]:
    with open(path, encoding="utf-8") as f:
        return f.read().split("\n")[:-1]


_SUMMARY = re.compile(r"(PRED|GOLD) SCORE: (\S+), \1 PPL: (\S+) NB SENTENCES: (\d+)")


def log_summaries(log_path: str) -> Dict[str, tuple]:
    """{'PRED': (score, ppl, n), 'GOLD': ...} from an OpenNMT-py log."""
    with open(log_path, encoding="utf-8") as f:
        return {m.group(1): (float(m.group(2)), float(m.group(3)), int(m.group(4)))
                for m in _SUMMARY.finditer(f.read())}


def log_sentences(log_path: str) -> Dict[int, dict]:
    """Per-sentence verbose records: {n: {'pred_score', 'gold_score', 'best': [scores]}}."""
    with open(log_path, encoding="utf-8") as f:
        text = f.read()
    records = {}
    for block in text.split("\nSENT ")[1:]:
        number = int(block.split(":", 1)[0])
        rec = {}
        m = re.search(r"\nPRED SCORE: (\S+)", block)
        if m:
            rec["pred_score"] = float(m.group(1))
        m = re.search(r"\nGOLD SCORE: (\S+)", block)
        if m:
            rec["gold_score"] = float(m.group(1))
        rec["best"] = [float(x) for x in re.findall(r"\n\[(-?[\d.]+|-inf)\] ", block)]
        records[number] = rec
    return records


def log_matrices(log_path: str) -> List[List[List[float]]]:
    """The -attn_debug matrices of an OpenNMT-py log, numbers only, in sentence order."""
    with open(log_path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    matrices, current = [], None
    for line in lines:
        if line.startswith("[") and "INFO]" in line:
            if current:
                matrices.append(current)
            current = [] if line.rstrip().endswith("INFO]") or " INFO]   " in line else None
            continue
        if current is not None and line.strip():
            numbers = re.findall(r"-?\d+\.\d{7}", line[11:])
            if numbers:
                current.append([float(x) for x in numbers])
    if current:
        matrices.append(current)
    return [m for m in matrices if m]


class _Layout:
    """The order in which a batch's beams advance, step by step (shared by its beams)."""

    def __init__(self):
        self.step, self.previous, self.current, self.snapshot = None, [], [], {}


class BlockingBugBeam:
    """Mixin reproducing OpenNMT-py 3.5.1's n-gram blocking after a sentence leaves the batch:
    its per-hypothesis forbidden n-gram tables are not reordered with the other state, so the
    sentence now at position p of the batch inherits the tables of the one at position p before.
    """

    def advance(self, word_logprobs, attn_out):
        layout, step = self.layout, len(self.next_ys)
        if step != layout.step:  # first beam of a new step
            layout.previous = layout.current
            layout.snapshot = {id(b): b.blocker.tables for b in layout.previous}
            layout.current, layout.step = [], step
        position = len(layout.current)
        if layout.previous and [id(b) for b in layout.previous] != [
                id(b) for b in layout.previous if not b.done()]:
            source = layout.previous[position]
            self.blocker.tables = [{k: set(v) for k, v in t.items()}
                                   for t in layout.snapshot[id(source)]]
        layout.current.append(self)
        super().advance(word_logprobs, attn_out)


def buggy_blocking_translator(translator):
    """A copy of ``translator`` whose beams reproduce OpenNMT-py's blocking bug."""
    from onmt_lite.search.beam import Beam
    from onmt_lite.translate.translator import Translator

    class BuggyBeam(BlockingBugBeam, Beam):
        pass

    class BuggyTranslator(Translator):
        def _beam_search(self, src, src_len, max_length):
            self.layout = _Layout()
            return super()._beam_search(src, src_len, max_length)

        beam_class = BuggyBeam

        def _new_beam(self, max_length):
            beam = super()._new_beam(max_length)
            beam.layout = self.layout
            return beam

    return BuggyTranslator(translator.model, translator.src_vocab, translator.tgt_vocab,
                           translator.opt, model_max_src_len=translator.model_max_src_len)


class TieRecordingBeam:
    """Mixin recording, per step, the gap between the last kept candidate and the first dropped."""

    def advance(self, word_logprobs, attn_out):
        import torch
        real_topk, gaps, size = torch.Tensor.topk, self.__dict__.setdefault("gaps", []), self.size

        def topk(tensor, k, *args, **kwargs):
            if tensor.dim() == 1 and k == size and tensor.numel() > k:
                values = real_topk(tensor, k + 1).values
                gaps.append(float(values[k - 1] - values[k]))
            return real_topk(tensor, k, *args, **kwargs)

        torch.Tensor.topk = topk
        try:
            super().advance(word_logprobs, attn_out)
        finally:
            torch.Tensor.topk = real_topk


def smallest_boundary_gaps(case: Case, model: str, translator_cache: dict, lines) -> dict:
    """{line: the smallest score gap at the beam boundary over the search of that line}."""
    from onmt_lite.search.beam import Beam
    from onmt_lite.translate.translator import Translator
    results = run_case(case, model, translator_cache, only=set())  # builds the translator
    del results
    base = translator_cache[model]
    options = {k: v for k, v in case.options.items() if k != "batch_size"}
    options["beam_engine"] = "sentence"  # the recording Beam
    from onmt_lite.translate.options import DecodingOptions

    class RecordingBeam(TieRecordingBeam, Beam):
        pass

    class RecordingTranslator(Translator):
        beam_class = RecordingBeam

        def _beam_search(self, src, src_len, max_length):
            self.beams = []
            return super()._beam_search(src, src_len, max_length)

        def _new_beam(self, max_length):
            beam = super()._new_beam(max_length)
            self.beams.append(beam)
            return beam

    translator = RecordingTranslator(base.model, base.src_vocab, base.tgt_vocab,
                                     DecodingOptions(**options),
                                     model_max_src_len=base.model_max_src_len)
    gaps, wanted = {}, set(lines)
    for batch in translator.translate_batches(case.src, case.tgt,
                                              case.options.get("batch_size", 32)):
        for trans, beam in zip(batch, translator.beams):
            if trans.index in wanted:
                gaps[trans.index] = min(beam.gaps)
        if wanted <= set(gaps):
            break
    return gaps


def run_case(case: Case, model: str, translator_cache: dict, only: Optional[set] = None,
             reproduce_bug: bool = False, engine: str = "sentence"):
    """Translates as the case says; returns (translations in input order, decoded line numbers)."""
    from onmt_lite.translate import DecodingOptions, Translator, build_translator
    options = {k: v for k, v in case.options.items() if k != "batch_size"}
    options["beam_engine"] = "sentence" if reproduce_bug else engine
    if model not in translator_cache:
        translator_cache[model] = build_translator(
            {"model": os.path.join(FIXTURES, f"{model}.pt")})
    base = translator_cache[model]
    translator = Translator(base.model, base.src_vocab, base.tgt_vocab,
                            DecodingOptions(**options), model_max_src_len=base.model_max_src_len)
    if reproduce_bug:
        translator = buggy_blocking_translator(translator)
    batch_size = case.options.get("batch_size", 32)
    results = {}
    for batch in translator.translate_batches(case.src, case.tgt, batch_size, only=only):
        for t in batch:
            results[t.index] = t
    return results


def compare(case: Case, model: str, results: dict) -> dict:
    """Compares translations with the reference files; returns a report dict."""
    n_best = case.options.get("n_best", 1)
    ref_lines = read(case.ref_path(model, "txt"))
    report = {"case": case.name, "model": model, "lines": 0, "match": 0, "mismatch": [],
              "divergent": [], "score_mismatch": [], "attn_mismatch": [], "attn_divergent": []}
    for index, trans in sorted(results.items()):
        ours = trans.output_lines(case.with_score)
        theirs = ref_lines[index * n_best:(index + 1) * n_best]
        report["lines"] += 1
        if case.with_score:
            same_text = [o.split("\t")[0] for o in ours] == [t.split("\t")[0] for t in theirs]
            scores_ok = all(abs(float(o.split("\t")[1]) - float(t.split("\t")[1])) < 1e-4
                            for o, t in zip(ours, theirs))
            ok = same_text and scores_ok
        else:
            ok = ours == theirs
        if ok:
            report["match"] += 1
        elif case.divergence == "replace_unk" and _explained_by_replace_unk(trans, theirs[0]):
            report["divergent"].append(index)
        else:
            report["mismatch"].append(index)
    log = case.ref_path(model, "log")
    sentences = log_sentences(log)
    if sentences and case.name in ("gold", "nbest3_noscore"):
        # OpenNMT-py numbers -verbose records in input order.
        for index, trans in results.items():
            rec = sentences.get(index + 1, {})
            checks = []
            if case.name == "gold":
                checks = [(trans.scores[0], rec.get("pred_score")),
                          (trans.gold_score, rec.get("gold_score"))]
            elif rec.get("best"):
                checks = list(zip(trans.scores, rec["best"]))
            if any(b is None or abs(a - b) > 1.5e-4 for a, b in checks):
                report["score_mismatch"].append(index)
    if case.attn_debug:
        matrices = log_matrices(log)
        for index, trans in sorted(results.items()):
            theirs = matrices[index] if index < len(matrices) else None
            verdict = _attention_verdict(trans.attns[0].tolist(), theirs, results, trans)
            if verdict == "divergent":
                report["attn_divergent"].append(index)
            elif verdict != "same":
                report["attn_mismatch"].append(index)
    return report


def _close(a, b, tol=5e-6) -> bool:  # other CPUs' products differ by a few 1e-6
    return len(a) == len(b) and all(abs(x - y) <= tol for x, y in zip(a, b))


def _attention_verdict(ours, theirs, batch_results, trans) -> str:
    """'same', 'divergent' (explained by OpenNMT-py's width bug) or 'different'.

    OpenNMT-py 3.5.1 cuts a finished hypothesis's attention to ``src_len[i]`` where ``i`` is the
    sentence's position in the batch but ``src_len`` has one entry per *hypothesis* row: every
    sentence but the first gets the width of another sentence of its batch (or the padded
    width, padding columns being exactly 0). Values agree on the shared columns.
    """
    if theirs is None or len(theirs) != len(ours):
        return "different"
    if all(_close(a, b) for a, b in zip(ours, theirs)):
        return "same"
    width = len(theirs[0])
    if any(len(row) != width for row in theirs):
        return "different"
    shared = min(width, len(ours[0]))
    if not all(_close(a[:shared], b[:shared]) for a, b in zip(ours, theirs)):
        return "different"
    if any(v != 0.0 for row in theirs for v in row[shared:]):
        return "different"
    widths = {len(t.src) for t in batch_results.values()}
    return "divergent" if width in widths or width >= max(widths) else "different"


def _explained_by_replace_unk(trans, theirs: str) -> bool:
    """OpenNMT-py copies the source *vocabulary* entry (<unk> for an unknown word) and picks it
    from attention cut to the wrong width (see _attention_verdict); onmt_lite copies the source
    word with the highest attention. Lines must agree everywhere but at generated <unk>s."""
    ours = trans.preds[0]
    ref = theirs.split(" ")
    if len(ours) != len(ref):
        return False
    in_vocab = {tok for tok, mapped in zip(trans.src, trans.src_vocab) if mapped == tok}
    differs = [i for i, (a, b) in enumerate(zip(ours, ref)) if a != b]
    return bool(differs) and all(
        ours[i] in trans.src and (ref[i] == "<unk>" or ref[i] in in_vocab) for i in differs)


def summary_check(case: Case, model: str, results: dict) -> dict:
    """Our PRED/GOLD summary numbers vs the log's (whole files only)."""
    theirs = log_summaries(case.ref_path(model, "log"))
    best = [t.scores[0] for _, t in sorted(results.items())]
    out = {}
    if "PRED" in theirs:
        ours = sum(best) / len(best)
        out["PRED"] = (round(ours, 4), theirs["PRED"][0])
    if "GOLD" in theirs:
        gold = [t.gold_score for _, t in sorted(results.items())]
        out["GOLD"] = (round(sum(gold) / len(gold), 4), theirs["GOLD"][0])
    return out


def main(models) -> None:
    cache: dict = {}
    table = []
    for model in models:
        for case in CASES:
            if os.environ.get("PARITY_CASES") and case.name not in os.environ["PARITY_CASES"].split(","):
                continue
            results = run_case(case, model, cache, engine=os.environ.get("PARITY_ENGINE", "sentence"))
            report = compare(case, model, results)
            report["summary"] = summary_check(case, model, results)
            if report["mismatch"] and case.divergence != "blocking":
                report["boundary_gaps"] = smallest_boundary_gaps(
                    case, model, cache, report["mismatch"])
            if case.divergence == "blocking":
                buggy = compare(case, model, run_case(case, model, cache, reproduce_bug=True))
                report["with_their_bug_reproduced"] = buggy["match"]
            table.append(report)
            print(json.dumps({k: (v[:20] if isinstance(v, list) else v) for k, v in report.items()}),
                  flush=True)


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    import torch
    torch.set_num_threads(int(os.environ.get("PARITY_THREADS", "1")))
    main(sys.argv[1:] or MODELS)
