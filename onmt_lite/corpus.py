"""Reading text files: UTF-8, one sentence per line, whitespace tokens."""
import sys
from typing import Iterable, Iterator, List, Optional, Union

BOM = "\ufeff".encode("utf-8")


class InputError(ValueError):
    """Bad input: the message names the file, the line and the problem."""


def iter_lines(path: str) -> Iterator[str]:
    """Yields the lines of a UTF-8 text file (``-`` = standard input) without their newlines,
    reading as it goes.

    Raises:
        InputError: the file is missing, unreadable or not valid UTF-8 (naming the line).
    """
    try:
        f = sys.stdin.buffer if path == "-" else open(path, "rb")
    except OSError as err:
        raise InputError(f"{path}: cannot read: {err.strerror}") from None
    try:
        for number, raw in enumerate(f, start=1):
            if number == 1 and raw.startswith(BOM):  # a byte-order mark is not part of a word
                raw = raw[len(BOM):]
            try:
                yield raw.rstrip(b"\n").decode("utf-8").rstrip("\r")
            except UnicodeDecodeError as err:
                raise InputError(f"{path}:{number}: invalid UTF-8 at byte {err.start}") from None
    except OSError as err:
        raise InputError(f"{path}: cannot read: {err.strerror}") from None
    finally:
        if f is not sys.stdin.buffer:
            f.close()


def read_lines(path: str) -> List[str]:
    """All lines of a UTF-8 text file (see iter_lines)."""
    return list(iter_lines(path))


def tokenize(line: str) -> List[str]:
    return line.split()


def read_parallel(src_path: str, tgt_path: Optional[str]) -> tuple:
    """Reads a source file and an optional target file with the same number of lines."""
    src = read_lines(src_path)
    tgt = read_lines(tgt_path) if tgt_path else None
    if tgt is not None and len(tgt) != len(src):
        raise InputError(f"{tgt_path}: has {len(tgt)} lines but {src_path} has {len(src)}")
    return src, tgt


def lines_of(source: Union[str, Iterable[str]]) -> Iterator[str]:
    """A path or ``-`` is read as it goes; a list (or any iterable) of lines is used as it is."""
    return iter_lines(source) if isinstance(source, str) else iter(source)
