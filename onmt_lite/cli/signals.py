"""Stopping cleanly on Ctrl-C (SIGINT) and SIGTERM: the signal becomes an exception, so that
every ``with`` block on the way out (temporary output files above all) is unwound."""
import contextlib
import signal
from typing import Iterator


class Stopped(KeyboardInterrupt):
    """Raised in the main thread by SIGINT or SIGTERM. A KeyboardInterrupt, so that no
    ``except Exception`` swallows it, nor code that passes on only KeyboardInterrupt: tqdm's
    logging handler (-verbose lines above the progress bar) catches everything else."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
        self.name = signal.Signals(signum).name

    @property
    def exit_status(self) -> int:  # the shell's convention: 130 for SIGINT, 143 for SIGTERM
        return 128 + self.signum


def _raise(signum, frame):
    raise Stopped(signum)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise Stopped; the old handlers come back after."""
    previous = {s: signal.signal(s, _raise) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
