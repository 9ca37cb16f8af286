"""-phrase_table: a file of "source|||target" lines that translates the source words
-replace_unk copies, read and looked up as OpenNMT-py does."""
from typing import List

from onmt_lite.corpus import InputError, lines_of


def read_phrase_table(path: str) -> List[str]:
    """The lines of a -phrase_table file ("source|||target" each); refuses others by line."""
    if not path:
        return []
    lines = list(lines_of(path))
    for line_number, line in enumerate(lines, 1):
        if "|||" not in line:
            raise InputError(f"{path}: line {line_number}: expected 'source|||target', got "
                             f"{line[:40]!r}")
    return lines


def phrase(table: List[str], word: str) -> str:
    """``word``'s translation in the lines of a phrase ``table``, else ``word``. As OpenNMT-py
    reads the table: the last line that starts with ``word`` (a prefix match) gives it."""
    found = word
    for line in table:
        if line.startswith(word):
            found = line.split("|||")[1].strip()
    return found
