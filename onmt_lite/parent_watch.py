"""Child processes that end with their parent, whatever ends it.

A child blocked on a queue or a pipe never learns that its parent died of SIGKILL (the OOM
killer, a CI timeout, ``kill -9``): its siblings hold the same pipes open, so no end of file
comes, and it would live on holding its memory and the run's files. Each child (translate.py's
workers, the server's lanes) watches its parent instead, and exits once it has another one
(adopted by init or a subreaper). The parent-death signal (``prctl``) would not do: it fires
when the *thread* that started the child ends, and the server starts lanes from threads.
"""
import os
import threading
import time

POLL_SECONDS = 0.25


def end_with_parent(parent: int) -> None:
    """Starts a thread that ends this process within POLL_SECONDS once ``parent`` (the pid
    the parent passed before starting it) is no longer its parent."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(POLL_SECONDS)
        os._exit(1)  # the run it served is gone: nothing of its own is left to finish
    threading.Thread(target=watch, daemon=True, name="onmt_lite-parent-watch").start()


def running(pid: int) -> bool:
    """Whether process ``pid`` exists (another user's counts: it cannot be signalled)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
