"""The journal of a resumable run (``-resume``): what is done, kept next to the output.

Its first line says what the run translates: the source's (and references') SHA-256 and the
options that decide the output. Each further line is one decoded batch (its number and, per
input line, the output lines and the figures of the summary), appended and flushed to disk as
a whole, so a run killed at any point leaves whole batches and at most one torn last line,
which is ignored. A run with ``-resume`` reads the journal, refuses it by name if the source or
an option changed, and decodes only the batches it lacks; the finished output replaces the
journal.
"""
import hashlib
import json
import os
from typing import Dict, List, Optional

from onmt_lite.corpus import InputError

FORMAT = 1


class JournalError(ValueError):
    """A journal that does not belong to this run."""


def file_digest(path: Optional[str]) -> Optional[str]:
    if path is None:
        return None
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    except OSError as err:  # as the translation's own reading says it
        raise InputError(f"{path}: cannot read: {err.strerror}") from None
    return digest.hexdigest()


class Journal:
    """``done``: the numbers of the journaled batches; ``lines_done``: their input lines.
    Their records, ``{"index", "lines", "score", "words", "gold"}`` per input line, are read
    back one shard at a time (``records_of``), so a resumed run's memory stays bounded.

    Args:
        shard_size: lines per shard of the run (0: one shard), as the translator reads them.
    """

    def __init__(self, output: str, source: str, target: Optional[str], options: dict,
                 write: bool = True, shard_size: int = 0):
        self.path = output + ".journal"
        self.header = {"format": FORMAT, "source": file_digest(source),
                       "target": file_digest(target), "options": options}
        self.shard_size = shard_size
        self.done: set = set()
        self.lines_done = 0
        self.entries: Dict[int, List[int]] = {}  # shard -> file positions of its batches
        self.write = write  # under torchrun only rank 0 writes; every rank reads
        if os.path.exists(self.path):
            self._read()
        elif write:  # whole or not at all: written aside, then renamed
            with open(self.path + ".new", "w", encoding="utf-8") as f:
                f.write(json.dumps(self.header) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(self.path + ".new", self.path)

    def shard(self, index: int) -> int:
        return index // self.shard_size if self.shard_size else 0

    def _read(self) -> None:
        with open(self.path, "rb") as f:
            try:
                header = json.loads(f.readline())
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise JournalError(f"{self.path}: not a journal of onmt_lite (remove it to "
                                   "start afresh)") from None
            self._check(header)
            self.valid_end = f.tell()
            while True:
                position, line = f.tell(), f.readline()
                try:
                    entry = json.loads(line)
                except (json.JSONDecodeError, UnicodeDecodeError):  # the end, or a torn line
                    break
                self.done.add(entry["batch"])
                self.lines_done += len(entry["translations"])
                shard = self.shard(entry["translations"][0]["index"])
                self.entries.setdefault(shard, []).append(position)
                self.valid_end = f.tell()
        if self.write:  # a torn last line goes, so that new batches start on a line of their own
            with open(self.path, "r+b") as f:
                f.truncate(self.valid_end)

    def records_of(self, shard: int) -> Dict[int, dict]:
        """The journaled records of one shard, by input line index (once: then forgotten)."""
        records = {}
        with open(self.path, "rb") as f:
            for position in self.entries.pop(shard, []):
                f.seek(position)
                records.update((r["index"], r) for r in json.loads(f.readline())["translations"])
        return records

    def _check(self, header: dict) -> None:
        fresh = " (remove it to start afresh)"
        if header.get("format") != FORMAT:
            raise JournalError(f"{self.path}: written by another version of onmt_lite{fresh}")
        for key, name in (("source", "-src"), ("target", "-tgt")):
            if header.get(key) != self.header[key]:
                raise JournalError(f"{self.path}: written for another {name} file (its content "
                                   f"differs){fresh}")
        then, now = header.get("options", {}), self.header["options"]
        changed = [f"-{k} {then.get(k)!r} then, {now.get(k)!r} now"
                   for k in sorted(set(then) | set(now)) if then.get(k) != now.get(k)]
        if changed:
            raise JournalError(f"{self.path}: written with other options: {'; '.join(changed)}"
                               f"{fresh}")

    def add(self, number: int, records: List[dict]) -> None:
        """Records a decoded batch; on disk before this returns."""
        if self.write:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"batch": number, "translations": records}) + "\n")
                f.flush()
                os.fsync(f.fileno())

    def remove(self) -> None:
        if self.write and os.path.exists(self.path):
            os.remove(self.path)
