"""Reading text files: UTF-8, one sentence per line, whitespace tokens."""
import sys
from typing import List, Optional, Union


class InputError(ValueError):
    """Bad input: the message names the file, the line and the problem."""


def read_lines(path: str) -> List[str]:
    """Reads a UTF-8 text file (``-`` = standard input) into lines without their newlines.

    Raises:
        InputError: the file is missing, unreadable or not valid UTF-8 (naming the line).
    """
    try:
        if path == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(path, "rb") as f:
                data = f.read()
    except OSError as err:
        raise InputError(f"{path}: cannot read: {err.strerror}") from None
    raw_lines = data.split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()
    lines = []
    for number, raw in enumerate(raw_lines, start=1):
        try:
            lines.append(raw.decode("utf-8").rstrip("\r"))
        except UnicodeDecodeError as err:
            raise InputError(f"{path}:{number}: invalid UTF-8 at byte {err.start}") from None
    return lines


def tokenize(line: str) -> List[str]:
    return line.split()


def read_parallel(src_path: str, tgt_path: Optional[str]) -> tuple:
    """Reads a source file and an optional target file with the same number of lines."""
    src = read_lines(src_path)
    tgt = read_lines(tgt_path) if tgt_path else None
    if tgt is not None and len(tgt) != len(src):
        raise InputError(f"{tgt_path}: has {len(tgt)} lines but {src_path} has {len(src)}")
    return src, tgt


def lines_of(source: Union[str, List[str]]) -> List[str]:
    """A path or ``-`` is read; a list of lines is used as it is."""
    return read_lines(source) if isinstance(source, str) else list(source)
