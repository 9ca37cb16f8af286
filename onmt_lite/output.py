"""Writing output files so that a failure never leaves half a file in place of a good one.

A regular file (or a new one) is written to a temporary file beside it and renamed over it only
on success, keeping the old file's permissions. A symbolic link is followed and its target
written that way, so the link stays a link. Anything else that is not a regular file (a FIFO,
``/dev/null``, a terminal) cannot be replaced: it is written through. ``-`` is standard output.
"""
import os
import re
import stat
import sys
import tempfile
from typing import Optional, TextIO

from onmt_lite.parent_watch import running


class OutputError(ValueError):
    """An output path that cannot be written; the message names the path the user gave."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _stat(path: str) -> Optional[os.stat_result]:
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):  # nothing there (yet)
        return None


def _file_above(path: str) -> Optional[str]:
    """The file that stands where a folder of ``path`` should be (``a.txt`` in ``a.txt/out``)."""
    folder = os.path.dirname(path)
    while folder and not os.path.exists(folder) and folder != os.path.dirname(folder):
        folder = os.path.dirname(folder)
    return folder if folder and os.path.exists(folder) and not os.path.isdir(folder) else None


def same_file(a: str, b: str) -> bool:
    """Whether two paths name one file: through symbolic links, ``./`` or a hard link (same
    device and inode), or as one new path. ``-`` names no file."""
    if a == "-" or b == "-":
        return False

    def identity(path):
        try:
            st = os.stat(path)
        except OSError:
            return os.path.realpath(path)
        return st.st_dev, st.st_ino
    return identity(a) == identity(b)


def is_atomic(path: str) -> bool:
    """Whether OutputFile replaces ``path`` only on success (a regular file or a new one)."""
    if path == "-":
        return False
    st = _stat(os.path.realpath(path))
    return st is None or stat.S_ISREG(st.st_mode)


def check_output(path: str) -> None:
    """Raises OutputError unless ``path`` can be written as OutputFile writes it: called before
    the model loads, so that a wrong path costs nothing."""
    if path == "-":
        return
    if not path:
        raise OutputError("the output path is empty")
    real = os.path.realpath(path)
    st = _stat(real)
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise OutputError(f"{path}: is a directory, not a file")
    if st is not None and not stat.S_ISREG(st.st_mode):
        if not os.access(real, os.W_OK):
            raise OutputError(f"{path}: cannot write: permission denied")
        return  # written through
    if st is not None and not (st.st_mode & 0o222 and os.access(real, os.W_OK)):
        raise OutputError(f"{path}: the file is read-only (mode {stat.S_IMODE(st.st_mode):o}); "
                          "not overwritten")
    folder = os.path.dirname(real)
    if not os.path.isdir(folder):
        blocking = _file_above(path)
        if blocking:
            raise OutputError(f"{path}: {blocking} is a file, not a folder")
        raise OutputError(f"{path}: the folder {os.path.dirname(os.path.abspath(path))} "
                          "does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"{path}: cannot write in the folder {folder}: permission denied")


def remove_stale_temporaries(target: str) -> None:
    """Removes the temporary files of ``target`` that runs killed outright (SIGKILL, a power
    cut) left beside it: only files of this user named as OutputFile names them, whose process
    no longer runs."""
    folder, name = os.path.split(target)
    pattern = re.compile(r"\.tmp-(\d+)-[a-z0-9_]{8}-" + re.escape(name))
    try:
        entries = list(os.scandir(folder or "."))
    except OSError:
        return
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        if match is None or running(int(match.group(1))):
            continue
        try:
            if entry.stat(follow_symlinks=False).st_uid == os.getuid() and entry.is_file(
                    follow_symlinks=False):
                os.remove(entry.path)
        except OSError:
            pass


class _Writer:
    """A text file whose write errors (a full disk, a closed pipe) name the user's path."""

    def __init__(self, file: TextIO, path: str):
        self.file, self.path = file, path

    def write(self, text: str) -> int:
        try:
            return self.file.write(text)
        except OSError as err:
            raise OutputError(f"{self.path}: cannot write: {err.strerror}") from None


class OutputFile:
    """Context manager giving a text file to write; see the module docstring.

    On success the output appears whole; on an exception (KeyboardInterrupt included) a
    regular file is left as it was and no temporary file remains. OS errors become
    OutputError naming ``path``.
    """

    def __init__(self, path: str):
        self.path = path
        self.file: Optional[TextIO] = None
        self.tmp: Optional[str] = None

    def __enter__(self) -> _Writer:
        if self.path == "-":
            return _Writer(sys.stdout, "standard output")
        check_output(self.path)
        self.target = os.path.realpath(self.path)
        st = _stat(self.target)
        try:
            if st is not None and not stat.S_ISREG(st.st_mode):
                self.file = open(self.target, "w", encoding="utf-8")
                return _Writer(self.file, self.path)
            self.mode = stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask()
            fd, self.tmp = tempfile.mkstemp(dir=os.path.dirname(self.target),
                                            prefix=f".tmp-{os.getpid()}-",
                                            suffix="-" + os.path.basename(self.target))
            self.file = os.fdopen(fd, "w", encoding="utf-8")
        except OSError as err:
            self._discard()
            raise OutputError(f"{self.path}: cannot write: {err.strerror}") from None
        return _Writer(self.file, self.path)

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self.path == "-":
            try:
                sys.stdout.flush()
            except OSError as err:
                if exc_type is None:
                    raise OutputError(f"standard output: cannot write: {err.strerror}") from None
            return False
        try:
            self.file.close()
            if exc_type is None and self.tmp is not None:
                os.chmod(self.tmp, self.mode)
                os.replace(self.tmp, self.target)
                self.tmp = None
                remove_stale_temporaries(self.target)
        except OSError as err:
            if exc_type is None:
                raise OutputError(f"{self.path}: cannot write: {err.strerror}") from None
        finally:
            self._discard()
        return False

    def _discard(self) -> None:
        if self.tmp is not None:
            try:
                os.remove(self.tmp)
            except OSError:
                pass
            self.tmp = None
