"""Errors shared by the library and its commands. The command line imports them before torch
(it refuses bad options and files first, at once), so none of them may need torch."""


class OptionError(ValueError):
    """An option value, or a combination of options, that is refused. The commands exit with
    status 2 on it, as on an option the command line itself refuses."""


class CheckpointError(ValueError):
    """A file that is not a loadable checkpoint; the message names the file and the problem."""


class WorkerError(RuntimeError):
    """A worker process ended without its batch (killed, out of memory, crashed)."""
