"""Each loaded model's weights, once per server: its translator written to a file that every lane
maps read-only (lanes.ModelSource), so that the lanes share the same pages of memory.

The files live in a folder of the server's own (mode 0700, under the system's temporary folder:
$TMPDIR), named after the server's process id, and go when their model is unloaded and when the
server stops; the folder of a server that was killed is removed by the next one to start.
"""
import ctypes
import gc
import logging
import os
import shutil
import tempfile
import threading
from typing import Optional

from onmt_lite.parent_watch import running

logger = logging.getLogger("onmt_lite")

PREFIX = "onmt_lite-weights-"


def weights_bytes(model) -> int:
    """The bytes of a model's tensors (parameters and buffers, each storage once)."""
    seen, total = set(), 0
    for tensor in list(model.parameters()) + list(model.buffers()):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def free_memory() -> None:
    """Gives freed memory back to the system: glibc's allocator keeps what a model's loading or
    a search freed (80-100 MiB after building the Argos package's translator) until
    malloc_trim."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


class WeightFiles:
    """The folder of the server's weight files, made at the first one written."""

    def __init__(self):
        self.folder: Optional[str] = None
        self.lock = threading.Lock()
        self.count = 0

    def path(self, name: str) -> str:
        """A new file's path in the folder (made at the first one)."""
        with self.lock:
            if self.folder is None:
                _remove_stale()
                self.folder = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")
            self.count += 1
            return os.path.join(self.folder, f"{self.count}-{name}.pt")

    def close(self) -> None:
        with self.lock:
            if self.folder is not None:
                shutil.rmtree(self.folder, ignore_errors=True)
                self.folder = None


def write_translator(translator, path: str, name: str) -> bool:
    """Writes ``translator`` (its model included) to ``path`` for the lanes to map; False, after
    one line that says why, where torch cannot write it (each lane then builds its own copy).
    Compiled programs are written without their code, which each lane loads from the compile
    cache (compiled_step.attach). Run where the model was built: the server's own process never
    imports torch."""
    import torch
    try:
        torch.save(translator, path)
    except Exception as err:  # noqa: BLE001 - any object torch cannot write: lanes build it
        logger.info("%s: its weights are not shared between the lanes: it cannot be "
                    "written for them to map (%s: %s); each lane loads its own copy", name,
                    type(err).__name__, str(err).splitlines()[0][:200] if str(err) else "")
        remove(path)
        return False
    return True


def remove(path: Optional[str]) -> None:
    if path is not None:
        try:
            os.unlink(path)
        except OSError:
            pass


def _remove_stale() -> None:
    """Removes the weight folders of servers that are no longer running (killed)."""
    root = tempfile.gettempdir()
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        if not name.startswith(PREFIX):
            continue
        pid = name[len(PREFIX):].split("-")[0]
        if not pid.isdigit() or running(int(pid)):
            continue
        path = os.path.join(root, name)
        try:
            if os.stat(path).st_uid == os.getuid():
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass
