"""Errors shared by the library and its commands."""


class OptionError(ValueError):
    """An option value, or a combination of options, that is refused. The commands exit with
    status 2 on it, as on an option the command line itself refuses."""
