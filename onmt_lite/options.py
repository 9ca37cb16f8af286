"""Option plumbing shared by the commands: ``-name`` and ``--name`` forms, typed and
range-checked values whatever their source (command line or YAML ``-config``), one-line errors."""
import argparse
import math
import sys
from typing import List, Optional

import yaml

from onmt_lite.errors import OptionError


class Parser(argparse.ArgumentParser):
    """ArgumentParser whose help shows the defaults and whose errors take one line."""

    def __init__(self, **kwargs):
        super().__init__(formatter_class=argparse.ArgumentDefaultsHelpFormatter, **kwargs)

    def error(self, message: str):
        sys.stderr.write(f"{self.prog}: error: {message} (-h for help)\n")
        sys.exit(2)


class Bounded:
    """An argparse ``type`` that parses a number and checks its range; also given YAML values,
    which must already be of the right kind (``2.5`` is not an integer, ``true`` not a number).
    A number must be finite: nan compares False with every bound, and inf wrecks the scores."""

    def __init__(self, kind: type, low=None, high=None, above=None):
        self.kind, self.low, self.high, self.above = kind, low, high, above
        self.__name__ = kind.__name__  # argparse names the type in some messages

    def __call__(self, value):
        what = "an integer" if self.kind is int else "a number"
        if isinstance(value, str):
            try:
                value = self.kind(value)
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected {what}, got {value!r}") from None
        kinds = (int,) if self.kind is int else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds):
            raise argparse.ArgumentTypeError(f"expected {what}, got {value!r}")
        try:
            value = self.kind(value)
        except OverflowError:  # an integer too large for a float
            value = math.inf
        if self.kind is float and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {value}")
        if self.low is not None and value < self.low:
            raise argparse.ArgumentTypeError(f"must be at least {self.low}, got {value}")
        if self.high is not None and value > self.high:
            raise argparse.ArgumentTypeError(f"must be at most {self.high}, got {value}")
        if self.above is not None and value <= self.above:
            raise argparse.ArgumentTypeError(f"must be more than {self.above}, got {value}")
        return value


def integer(low: Optional[int] = None, high: Optional[int] = None) -> Bounded:
    return Bounded(int, low, high)


def number(low: Optional[float] = None, high: Optional[float] = None,
           above: Optional[float] = None) -> Bounded:
    return Bounded(float, low, high, above)


def add(group, name: str, **kwargs) -> None:
    """Registers an option under OpenNMT-py's single-dash name and its ``--`` form."""
    group.add_argument(f"-{name}", f"--{name}", dest=name, **kwargs)


def config_value(action: argparse.Action, value):
    """A YAML value checked as the command line would check it; raises ArgumentTypeError."""
    if action.nargs == 0:  # a flag: store_true
        if not isinstance(value, bool):
            raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")
        return value
    if action.nargs in ("+", "*"):
        values = value if isinstance(value, list) else [value]
        return [_one_value(action, v) for v in values]
    return _one_value(action, value)


def _one_value(action: argparse.Action, value):
    if action.type is not None:
        value = action.type(value)
    elif not isinstance(value, str):
        raise argparse.ArgumentTypeError(f"expected text, got {value!r}")
    if action.choices is not None and value not in action.choices:
        raise argparse.ArgumentTypeError(
            f"must be one of {', '.join(map(str, action.choices))}, got {value!r}")
    return value


def read_config(path: str) -> dict:
    """The mapping of a YAML config file (empty: {}); raises OptionError in one line naming
    the file (and the line of a byte that is not UTF-8)."""
    if not path:
        raise OptionError("-config: the path is empty")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as err:
        raise OptionError(f"{path}: cannot read: {err.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise OptionError(f"{path}: line {line}: not UTF-8 (byte 0x{data[err.start]:02x}); "
                          "save the file as UTF-8") from None
    try:
        values = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise OptionError(f"{path}: not valid YAML: {' '.join(str(err).split())}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise OptionError(f"{path}: expected a mapping of option names to values")
    return values


def parse_with_config(parser: argparse.ArgumentParser, argv: Optional[List[str]]):
    """Parses argv; values from ``-config FILE.yaml`` act as defaults that the command line
    overrides. Unknown keys and values of the wrong kind or range are errors, as on the command
    line. ``args.given_options`` names the options the user set (a model's own defaults apply
    to the others)."""
    args = parser.parse_args(argv)
    given = _given_on_command_line(parser, argv)  # -config values count as given too
    if getattr(args, "config", None):
        try:
            values = read_config(args.config)
        except OptionError as err:
            parser.error(str(err))
        actions = {a.dest: a for a in parser._actions if a.dest not in ("help", "config")}
        unknown = sorted(set(values) - set(actions) - {"config"})
        if unknown:
            parser.error(f"{args.config}: unknown options: {', '.join(map(str, unknown))}")
        checked = {}
        for name, value in values.items():
            if name == "config":
                continue
            try:
                checked[name] = config_value(actions[name], value)
            except argparse.ArgumentTypeError as err:
                parser.error(f"{args.config}: {name}: {err}")
        parser.set_defaults(**checked)
        args = parser.parse_args(argv)
        given |= set(checked)
    args.given_options = frozenset(given)
    return args


def _given_on_command_line(parser: argparse.ArgumentParser, argv) -> set:
    """The options argv names (whatever their values): parsed again without defaults."""
    defaults = {a: a.default for a in parser._actions}
    try:
        for action in defaults:
            action.default = argparse.SUPPRESS
        return set(vars(parser.parse_args(argv)))
    finally:
        for action, default in defaults.items():
            action.default = default
