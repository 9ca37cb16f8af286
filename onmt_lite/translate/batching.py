"""The input in shards and batches: lines read ``shard_size`` at a time (with their -tgt lines),
each shard's lines sorted by length and cut into batches as OpenNMT-py cuts them; the line count
of the progress bar."""
import itertools
import os
from typing import Callable, Iterator, List, Optional

from onmt_lite.corpus import InputError, lines_of


def line_count(src) -> Optional[int]:
    """The progress bar's total: the lines of a regular file (read once, fast) or of a list; None
    for standard input, a pipe or a device, which counting would use up."""
    if not isinstance(src, str):
        return len(src) if hasattr(src, "__len__") else None
    if src == "-" or not os.path.isfile(src):
        return None
    with open(src, "rb") as f:
        data = f.read(1 << 20)
        count, last = 0, b"\n"
        while data:
            count += data.count(b"\n")
            last = data[-1:]
            data = f.read(1 << 20)
    return count + (last != b"\n")


def shards(src, tgt, shard_size: int):
    """Yields (offset, source lines, target lines or None) of up to ``shard_size`` lines."""
    src_iter = lines_of(src)
    tgt_iter = lines_of(tgt) if tgt is not None else None
    offset = 0
    while True:
        src_lines = list(itertools.islice(src_iter, shard_size or None))
        tgt_lines = None
        if tgt_iter is not None:
            tgt_lines = list(itertools.islice(tgt_iter, len(src_lines)))
            short = len(tgt_lines) < len(src_lines)
            src_ended = not shard_size or len(src_lines) < shard_size
            long = src_ended and not short and next(tgt_iter, None) is not None
            if short or long:
                n_src = offset + len(src_lines) + sum(1 for _ in src_iter)
                n_tgt = offset + len(tgt_lines) + long + sum(1 for _ in tgt_iter)
                name = tgt if isinstance(tgt, str) else "-tgt"
                raise InputError(f"{name}: has {n_tgt} lines but the source has {n_src}")
        if not src_lines:
            return
        yield offset, src_lines, tgt_lines
        offset += len(src_lines)


def batches(src_tokens: List[List[str]], tgt_tokens: Optional[List[List[str]]],
            batch_size: int, batch_type: str, empty: Callable[[List[str]], bool]
            ) -> Iterator[List[int]]:
    """Sorts non-empty lines by length (stable; by (source, target) length with -tgt) and
    cuts consecutive batches, as OpenNMT-py does: ``batch_size`` sentences, or with
    ``tokens`` as many as keep sentences x the batch's longest line within ``batch_size``,
    a line's length being its source's or, with -tgt, its target's with <s> and </s> if
    longer (onmt/inputters/dynamic_iterator.py batch_iter, max_src_tgt). The lines whose
    source is ``empty`` come last, in one batch.

    Yields:
        each batch's line numbers in the shard.
    """
    order = [i for i, toks in enumerate(src_tokens) if not empty(toks)]
    if tgt_tokens is None:
        order.sort(key=lambda i: len(src_tokens[i]))
    else:
        order.sort(key=lambda i: (len(src_tokens[i]), len(tgt_tokens[i]) + 2))

    def length(i: int) -> int:
        if batch_type != "tokens":
            return 1
        return len(src_tokens[i]) if tgt_tokens is None else max(len(src_tokens[i]),
                                                                  len(tgt_tokens[i]) + 2)
    batch: List[int] = []
    longest = 0
    for i in order:
        if batch and (len(batch) + 1) * max(longest, length(i)) > batch_size:
            yield batch
            batch, longest = [], 0
        batch.append(i)
        longest = max(longest, length(i))
    if batch:
        yield batch
    empties = [i for i, toks in enumerate(src_tokens) if empty(toks)]
    if empties:
        yield empties
