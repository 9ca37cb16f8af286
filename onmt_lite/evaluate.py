"""Corpus BLEU and chrF through sacrebleu, with the signature that makes a score reproducible."""
from dataclasses import dataclass
from typing import List, Sequence

import sacrebleu

from onmt_lite.corpus import InputError, read_lines


@dataclass
class Score:
    metric: str  # "BLEU" or "chrF"
    score: float
    signature: str
    text: str  # sacrebleu's one-line report


def corpus_scores(hyps: Sequence[str], refs: Sequence[Sequence[str]], tokenize: str = "13a",
                  lowercase: bool = False, metrics=("bleu", "chrf")) -> List[Score]:
    """Scores hypothesis lines against one or more reference streams of the same length."""
    if not hyps:
        raise InputError("the hypothesis file has no lines")
    for i, ref in enumerate(refs):
        if len(ref) != len(hyps):
            raise InputError(f"reference {i + 1} has {len(ref)} lines but the hypotheses have "
                             f"{len(hyps)}")
    scores = []
    if "bleu" in metrics:
        # force: with tokenize=none the input is tokenized on purpose; no detokenization warning
        bleu = sacrebleu.BLEU(tokenize=tokenize, lowercase=lowercase, force=tokenize == "none")
        result = bleu.corpus_score(list(hyps), [list(r) for r in refs])
        scores.append(Score("BLEU", result.score, str(bleu.get_signature()), str(result)))
    if "chrf" in metrics:
        chrf = sacrebleu.CHRF(lowercase=lowercase)
        result = chrf.corpus_score(list(hyps), [list(r) for r in refs])
        scores.append(Score("chrF", result.score, str(chrf.get_signature()), str(result)))
    return scores


def evaluate_files(hyp_path: str, ref_paths: Sequence[str], **kwargs) -> List[Score]:
    """Reads the files (naming any bad one) and scores them."""
    hyps = read_lines(hyp_path)
    refs = []
    for path in ref_paths:
        lines = read_lines(path)
        if len(lines) != len(hyps):
            raise InputError(f"{path}: has {len(lines)} lines but {hyp_path} has {len(hyps)}")
        refs.append(lines)
    return corpus_scores(hyps, refs, **kwargs)
