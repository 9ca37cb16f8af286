"""translate.py -split_sentences LANG: each input line is a paragraph, cut into sentences as
LibreTranslate cuts it (sentences.py), its sentences translated in the file's batches, and its
translation made of theirs: one output line per input line, always (n-best: one per
hypothesis, the k-th made of each sentence's k-th), an empty line for an empty one.

A paragraph's Translation joins its sentences': their source tokens and hypotheses end to
end, their scores summed, their attention as a block diagonal (each sentence's rows over its
own source tokens; the ``</s>`` rows of all but the last dropped, as their tokens are).
"""
from typing import Iterator, List

import torch

from onmt_lite.errors import OptionError
from onmt_lite.translate import batching
from onmt_lite.translate.sentences import SentenceSplitter, SplitterUnavailable, join_sentences
from onmt_lite.translate.translation import Translation


def splitter_of(language: str) -> SentenceSplitter:
    try:
        return SentenceSplitter(language)
    except SplitterUnavailable as err:
        raise OptionError(f"-split_sentences: {err}") from None


def translate_paragraphs(translator, src, tgt, batch_size: int, progress: bool,
                         batch_type: str, shard_size: int) -> Iterator[Translation]:
    """One Translation per line of ``src``, in input order, read ``shard_size`` lines at a
    time (each shard's sentences decoded together)."""
    if tgt is not None:
        raise OptionError("-split_sentences: -tgt scores whole lines; not with it")
    splitter = splitter_of(translator.opt.split_sentences)
    for offset, lines, _ in batching.shards(src, None, shard_size):
        cuts = [splitter.split(line) for line in lines]
        flat = [sentence for sentences in cuts for sentence in sentences]
        done = {}
        for _, batch in translator.sentence_batches(flat, None, batch_size, progress,
                                                    batch_type=batch_type, shard_size=0):
            done.update((t.index, t) for t in batch)
        at = 0
        for number, sentences in enumerate(cuts):
            parts = [done[i] for i in range(at, at + len(sentences))]
            at += len(sentences)
            yield joined(offset + number, parts, translator.opt.n_best)


def joined(index: int, parts: List[Translation], n_best: int) -> Translation:
    """The paragraph ``index`` from its sentences' translations ``parts`` (none: empty)."""
    t = Translation(index, [tok for p in parts for tok in p.src],
                    [tok for p in parts for tok in p.src_vocab])
    t.preds = [[tok for p in parts for tok in p.preds[k]] for k in range(n_best)]
    t.scores = [sum((p.scores[k] for p in parts), 0.0) for k in range(n_best)]
    t.attns = [block_diagonal([p.attns[k] for p in parts], [len(p.src_vocab) for p in parts],
                              [len(p.preds[k]) for p in parts]) for k in range(n_best)]
    if all(p.texts is not None for p in parts):
        t.texts = [join_sentences([p.texts[k] for p in parts]) for k in range(n_best)]
    return t


def block_diagonal(attns: List[torch.Tensor], widths: List[int],
                   lengths: List[int]) -> torch.Tensor:
    """Each sentence's attention rows over its own columns; a sentence's rows past its tokens
    (its ``</s>``) kept for the last sentence only."""
    if not attns:
        return torch.zeros(0, 0)
    rows = [a if i == len(attns) - 1 else a[:length] for i, (a, length) in
            enumerate(zip(attns, lengths))]
    out = torch.zeros(sum(r.shape[0] for r in rows), sum(widths))
    top = left = 0
    for r, width in zip(rows, widths):
        if r.numel():
            out[top:top + r.shape[0], left:left + min(width, r.shape[1])] = r[:, :width]
        top, left = top + r.shape[0], left + width
    return out
