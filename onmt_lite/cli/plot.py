"""onmt_lite plot: draw the attention of an -attn_dump file, one PNG per sentence."""
import argparse
import json
import math
import sys
from typing import List, Optional, Tuple

from onmt_lite.corpus import InputError, iter_lines
from onmt_lite.options import Parser, add
from onmt_lite.translate.attention_plot import PlotError, plot_attention, plot_path, prepare_folder


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="onmt_lite plot", description=__doc__)
    add(parser, "attn_dump", required=True, help="JSON lines written by translate.py -attn_dump")
    add(parser, "output", required=True, help="folder for the pictures (created if missing)")
    return parser


def _shown(value) -> str:
    """A value as the file spells it, cut short so that a message stays one line."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _finite(value) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        return False


def _problem(index, src, pred, attention) -> Optional[str]:
    """What keeps a record from being drawn: wrong types, or a matrix that is not
    len(pred) rows of len(src) numbers (its labels would be wrong); None when it can be drawn."""
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        return f"index must be a non-negative integer, got {_shown(index)}"
    for name, tokens in (("src", src), ("pred", pred)):
        if not isinstance(tokens, list):
            return f"{name} must be a list of tokens, got {_shown(tokens)}"
        for i, token in enumerate(tokens):
            if not isinstance(token, str):
                return f"{name}[{i}] must be a string, got {_shown(token)}"
    if not isinstance(attention, list):
        return f"attention must be a list of rows, got {_shown(attention)}"
    for i, row in enumerate(attention):
        if not isinstance(row, list):
            return f"attention[{i}] must be a list of numbers, got {_shown(row)}"
        for j, value in enumerate(row):
            if not _finite(value):
                return f"attention[{i}][{j}] must be a finite number, got {_shown(value)}"
    if len(attention) != len(pred):
        return (f"attention has {_count(len(attention), 'row')} but pred has "
                f"{_count(len(pred), 'token')}")
    for i, row in enumerate(attention):
        if len(row) != len(src):
            return (f"attention[{i}] has {_count(len(row), 'column')} but src has "
                    f"{_count(len(src), 'token')}")
    return None


def _record(path: str, number: int, line: str) -> tuple:
    """(index, src, pred, attention) of one dump line; InputError names the line's problem."""
    try:
        record = json.loads(line)
        fields = record["index"], record["src"], record["pred"], record["attention"]
    except (ValueError, KeyError, TypeError, RecursionError):
        raise InputError(f"{path}:{number}: not an -attn_dump record (JSON with index, src, "
                         "pred and attention)") from None
    problem = _problem(*fields)
    if problem:
        raise InputError(f"{path}:{number}: {problem}")
    return fields


def _checked_lines(path: str) -> List[Tuple[int, str]]:
    """The dump's non-blank lines with their numbers, once every record is known to be drawable
    and to have its own index (two alike would draw the same picture).

    The lines are held as text rather than parsed (a matrix's numbers take about a third of the
    room as text as they do as Python floats), and not read again from the file (standard
    input cannot be). Each is parsed again to be drawn, which costs little beside drawing it."""
    lines, first_line = [], {}
    for number, line in enumerate(iter_lines(path), start=1):
        if not line.strip():
            continue
        index = _record(path, number, line)[0]
        if index in first_line:
            raise InputError(f"{path}:{number}: index {index} again (first on line "
                             f"{first_line[index]}): both would draw "
                             f"{plot_path('', index)}")
        first_line[index] = number
        lines.append((number, line))
    return lines


def _fail(message) -> int:
    print(f"onmt_lite plot: error: {message}", file=sys.stderr)
    return 1


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    # the whole file is checked before the first picture: a bad dump writes nothing
    try:
        lines = _checked_lines(args.attn_dump)
        prepare_folder(args.output)
    except (InputError, PlotError) as err:
        return _fail(err)
    for count, (number, line) in enumerate(lines):
        index, src, pred, attention = _record(args.attn_dump, number, line)
        try:
            plot_attention(src, pred, attention, plot_path(args.output, index))
        except PlotError as err:
            return _fail(f"{err} ({count} of {len(lines)} pictures written)")
    print(f"{_count(len(lines), 'picture')} in {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
