"""Hunts for differences between ``-search hf`` and transformers' own ``generate()``: tiny
random Marian models (tests/marian_dirs.py: three ordinary ones, one that never ends, one that
ends at once, one with a tiny target vocabulary whose pieces tie exactly in pairs), Multi30k
lines (training and test sets, raw), an empty line, one-token lines and lines longer than any of
training, under a sweep of beam sizes, returned sequences, length penalties, early stopping
rules, length limits at and near the outputs' lengths, n-gram and repetition penalties and
batch sizes (generate() pads each batch; onmt_lite sorts by length). From the repository root:

    python tests/reference/hunt_hf.py --full     # every model x 40 settings, ~36,000 lines
    python tests/reference/hunt_hf.py            # a quick sweep

Prints a table: per model and setting, the lines compared, those identical (every hypothesis,
in order, its tokens and its score within 1e-4), the ties (named, with both scores) and the
differences left unexplained. A line differs by a tie when the first hypotheses that differ
score the same within TIE: generate() and onmt_lite sum the same log-probs in other shapes
(generate() pads the batch, onmt_lite sorts it and drops finished sentences), so two
candidates whose scores agree to the last bits of float32 may come in either order; or, on the
tiny vocabulary, when they are "twins", the same but for tokens of equal embeddings and bias:
torch.topk orders exactly equal candidates by the whole row's layout, which differs between
the two toolkits' batches; what follows such a choice (penalties that count the tokens
chosen) may then score differently; or, where the first hypotheses that differ score
otherwise, when the line's own search (decoded alone) meets two candidates within TIE at the
edge of those it keeps (hunt_search.boundary_gaps): which survives is a coin toss of float sums
or of topk's order among equals, and all that follows differs.
test_search_presets.py runs a quick subset of this hunt.
"""
import argparse
import os
import random
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
from hunt_search import RELATIVE_TOL, SCORE_TOL, TIE, boundary_gaps  # noqa: E402
from marian_dirs import (  # noqa: E402
    OPUS_GENERATION,
    SOURCES,
    generated_ids,
    twin_choice,
    twin_pieces,
    without_trailing,
    write_marian,
)

from onmt_lite.translate import build_translator  # noqa: E402

MULTI30K = os.path.join(HERE, "..", "..", "..", "shared", "data", "multi30k")
# name -> write_marian arguments (max_position_embeddings: room for the longest sources)
MODELS = {
    "opus": dict(seed=6, eos_bias=3.0),
    "not renormalised": dict(seed=7, eos_bias=3.5,
                             generation={**OPUS_GENERATION, "renormalize_logits": False}),
    "no generation config": dict(seed=8, eos_bias=4.0, generation=None),
    "never ends": dict(seed=2, eos_bias=-30.0),
    "ends at once": dict(seed=3, eos_bias=6.0),
    "tiny vocabulary, exact ties": dict(seed=4, eos_bias=1.0, tiny_target=True),
}
POSITIONS = 400


def read_lines(name: str):
    path = os.path.join(MULTI30K, name)
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def edge_lines(train):
    """An empty line, one-token lines, lines longer than any of training (three joined)."""
    longest = max(train, key=len) if train else "A man is riding a bike."
    return ["", "A", "dog", ".", longest + " " + train[1] + " " + train[2] if train else
            longest * 4, " ".join(train[3:7]) if train else "Two dogs play " * 20] + SOURCES[:4]


def settings(count: int, seed: int = 0):
    """Hand-picked edges, then settings drawn at random: (name, generate() args, onmt_lite
    options, batch size)."""
    rng = random.Random(seed)
    picked = [  # (beam, returned, length_penalty, early_stopping, max_new, min_new, ngram, rep)
        (1, 1, 1.0, False, 4, 0, 0, 1.0), (1, 1, 1.0, False, 20, 3, 2, 1.3),
        (None, 1, 1.0, False, None, None, 0, 1.0),  # nothing given: generate()'s defaults
        (3, 3, 0.0, True, 1, 0, 0, 1.0), (5, 5, -1.0, "never", 6, 6, 0, 1.0),
        (12, 12, 2.0, "never", 12, 0, 3, 1.0), (6, 2, 0.6, True, 8, 1, 0, 0.8),
        (2, 1, 1.0, False, 30, 10, 2, 1.2),
    ]
    out = []
    for i in range(count):
        if i < len(picked):
            beam, n, alpha, early, longest, shortest, ngram, rep = picked[i]
        else:
            beam = rng.choice([1, 2, 3, 4, 5, 6, 8, 12])
            n = rng.choice(sorted({1, 2, beam} & set(range(1, beam + 1))))
            alpha = rng.choice([0.0, 0.6, 1.0, 2.0, -0.5, -1.0])
            early = rng.choice([True, False, "never"])
            longest = rng.choice([1, 2, 4, 8, 12, 20, 40])
            shortest = rng.choice([0, 0, 1, 3, 8, 12])
            ngram = rng.choice([0, 0, 1, 2, 3])
            rep = rng.choice([1.0, 1.0, 1.2, 1.5, 0.8])
        batch = (1, 7, 64)[i % 3]
        theirs = dict(num_beams=beam, num_return_sequences=n) if beam else {}
        ours = dict(beam_size=beam, n_best=n) if beam else {}
        if longest is not None:
            theirs.update(max_new_tokens=longest, min_new_tokens=min(shortest, longest),
                          length_penalty=alpha, early_stopping=early)
            ours.update(max_length=longest, min_length=min(shortest, longest), alpha=alpha,
                        early_stopping=str(early).lower())
        if ngram:
            theirs["no_repeat_ngram_size"], ours["block_ngram_repeat"] = ngram, ngram
        if rep != 1.0:
            theirs["repetition_penalty"], ours["repetition_penalty"] = rep, rep
        name = (", ".join(f"{k} {v}" for k, v in theirs.items()) or "nothing given") + \
            f", batch {batch}"
        out.append((name, theirs, ours, batch))
    return out


def generate(model, tokenizer, lines, batch_size: int, **kwargs):
    """generate()'s hypotheses per line, in batches of ``batch_size`` (padded):
    [(pieces with </s> if ended, score)]; greedy: the summed log-probs of the processed scores."""
    n = kwargs.get("num_return_sequences", 1)
    eos, pad = model.generation_config.eos_token_id, model.config.pad_token_id
    out = []
    for start in range(0, len(lines), batch_size):
        batch = tokenizer(lines[start:start + batch_size], return_tensors="pt", padding=True)
        with torch.no_grad():
            result = model.generate(**batch, do_sample=False, output_scores=True,
                                    return_dict_in_generate=True, **kwargs)
        if (kwargs.get("num_beams", model.generation_config.num_beams) or 1) > 1:
            scores = result.sequences_scores.tolist()
        else:
            steps = torch.stack([step.log_softmax(-1) for step in result.scores], 1).gather(
                2, result.sequences[:, 1:, None]).squeeze(2)  # (batch, steps)
            scores = [None] * len(result.sequences)
        hyps = []
        for i, seq in enumerate(result.sequences.tolist()):
            generated = generated_ids(seq, eos, pad)
            if scores[i] is None:
                scores[i] = float(steps[i][:len(generated)].sum())
            hyps.append((tokenizer.convert_ids_to_tokens(generated), scores[i]))
        out.extend(hyps[i:i + n] for i in range(0, len(hyps), n))
    return out


def classify(ours, theirs, twins=None):
    """'same', ('tie', rank, our score, their score, detail) or ('differs', rank, detail).
    ``twins``: pieces that tie exactly -> their twin (marian_dirs.twin_pieces)."""
    if len(ours) != len(theirs):
        return ("differs", -1, f"{len(ours)} hypotheses, generate() {len(theirs)}")
    for rank, ((tokens, score), (their_tokens, their_score)) in enumerate(zip(ours, theirs)):
        if tokens != their_tokens:
            alike = [[(twins or {}).get(t, t) for t in x] for x in (tokens, their_tokens)]
            if alike[0] == alike[1] or twin_choice(tokens, their_tokens, twins) or \
                    abs(score - their_score) <= TIE:
                kind = "twins" if alike[0] == alike[1] else "a twin first" if twin_choice(
                    tokens, their_tokens, twins) else "other tokens"
                return ("tie", rank, score, their_score, f"{kind}: {' '.join(tokens)} vs "
                                                         f"{' '.join(their_tokens)}")
            return ("differs", rank, f"{' '.join(tokens)} ({score:.7f}) vs "
                                     f"{' '.join(their_tokens)} ({their_score:.7f})")
        if abs(score - their_score) > max(SCORE_TOL, RELATIVE_TOL * abs(their_score)):
            return ("differs", rank, f"score {score:.7f} vs {their_score:.7f}")
    return "same"


def compare(folder: str, lines, setting, model=None, tokenizer=None):
    """One setting on one model: [(line, classify() result)]."""
    from transformers import MarianMTModel, MarianTokenizer
    _, theirs_args, ours_args, batch = setting
    tokenizer = tokenizer or MarianTokenizer.from_pretrained(folder)
    model = model or MarianMTModel.from_pretrained(folder).eval()
    expected = generate(model, tokenizer, lines, batch, **theirs_args)
    translator = build_translator({"model": folder, "search": "hf", **ours_args})
    results = translator.translate(lines, batch_size=batch)
    eos, pad = translator.tgt_vocab.specials["eos"], translator.tgt_vocab.specials["pad"]
    out = []
    for line, result, theirs in zip(lines, results, expected):
        # as generated_ids reads generate()'s rows: a hypothesis cut at the limit loses the
        # pad pieces that end it (picked when every candidate scored NaN)
        preds = [pred if their[0][-1:] == [eos] else without_trailing(pred, pad)
                 for pred, their in zip(result.preds, theirs)]
        ours = [(pred + [eos] * (their[0][-1:] == [eos]), score)
                for pred, score, their in zip(preds, result.scores, theirs)]
        ours += [(pred, score) for pred, score in
                 zip(result.preds[len(theirs):], result.scores[len(theirs):])]
        found = classify(ours, theirs, twin_pieces(folder))
        if found != "same" and found[0] == "differs":
            gap = boundary_gaps(folder, [line], {"search": "hf", **ours_args})[0]
            if gap < TIE:  # the line's own search keeps one of two (near) equal candidates
                found = ("tie", found[1], float("nan"), float("nan"),
                         f"at the beam's edge, gap {gap:.1e}: {found[2]}")
        out.append((line, found))
    return out


def write_models(folder: str, names=None):
    return {name: write_marian(os.path.join(folder, str(i)), max_position_embeddings=POSITIONS,
                               **MODELS[name])
            for i, name in enumerate(names or MODELS)}


def hunt(count: int, per_setting: int, test_lines: int, names=None, seed: int = 0):
    """Every model x ``count`` settings; each setting takes the next ``per_setting`` training
    lines (so the sweep walks the training file), ``test_lines`` of the test set, the edges."""
    from transformers import MarianMTModel, MarianTokenizer
    train, test = read_lines("train.en"), read_lines("test_2016_flickr.en")
    rng = random.Random(seed)
    test_pick = rng.sample(test, min(test_lines, len(test)))
    edges = edge_lines(train)
    position, rows = 0, []
    with tempfile.TemporaryDirectory() as folder:
        for name, model_dir in write_models(folder, names).items():
            tokenizer = MarianTokenizer.from_pretrained(model_dir)
            model = MarianMTModel.from_pretrained(model_dir).eval()
            for setting in settings(count, seed):
                chunk = [train[(position + i) % len(train)] for i in range(per_setting)] \
                    if train else []
                position += per_setting
                lines = edges + chunk + test_pick
                start = time.time()
                found = compare(model_dir, lines, setting, model, tokenizer)
                rows.append((name, setting[0], found, time.time() - start))
    return rows


def report(rows) -> int:
    """Prints the table and each tie and difference; returns the number of differences."""
    total = same = ties = differs = 0
    print(f"{'model':<28} {'setting':<120} {'lines':>5} {'same':>5} {'ties':>4} {'diff':>4}")
    notes = []
    for name, setting, found, seconds in rows:
        s = sum(r == "same" for _, r in found)
        t = [(line, r) for line, r in found if r != "same" and r[0] == "tie"]
        d = [(line, r) for line, r in found if r != "same" and r[0] == "differs"]
        total, same, ties, differs = total + len(found), same + s, ties + len(t), differs + len(d)
        print(f"{name:<28} {setting:<120} {len(found):>5} {s:>5} {len(t):>4} {len(d):>4}")
        notes += [f"TIE   {name} | {setting} | {line[:60]!r}: rank {r[1]}, onmt_lite "
                  f"{r[2]:.9f}, generate() {r[3]:.9f}; {r[4]}" for line, r in t]
        notes += [f"DIFF  {name} | {setting} | {line[:60]!r}: rank {r[1]}: {r[2]}"
                  for line, r in d]
    print("\n".join(notes))
    print(f"\n{total} lines compared: {same} identical ({same / max(total, 1):.2%}), "
          f"{ties} float ties, {differs} unexplained differences")
    return differs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="40 settings x 170 lines a model")
    parser.add_argument("--settings", type=int, help="settings per model")
    parser.add_argument("--lines", type=int, help="training lines per setting")
    parser.add_argument("--models", nargs="*", choices=list(MODELS), help="default: all")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from transformers.utils import logging
    logging.set_verbosity_error()
    count = args.settings or (40 if args.full else 10)
    per = args.lines or (120 if args.full else 20)
    rows = hunt(count, per, 40 if args.full else 10, args.models)
    sys.exit(1 if report(rows) else 0)


if __name__ == "__main__":
    main()
