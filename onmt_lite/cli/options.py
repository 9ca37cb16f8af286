"""Option plumbing shared by the commands: ``-name`` and ``--name`` forms, YAML ``-config``."""
import argparse
from typing import List, Optional

import yaml


def add(group, name: str, **kwargs) -> None:
    """Registers an option under OpenNMT-py's single-dash name and its ``--`` form."""
    group.add_argument(f"-{name}", f"--{name}", dest=name, **kwargs)


def parse_with_config(parser: argparse.ArgumentParser, argv: Optional[List[str]]):
    """Parses argv; values from ``-config FILE.yaml`` act as defaults that the command line overrides.

    Unknown keys in the YAML file are an error, as unknown options are.
    """
    args = parser.parse_args(argv)
    if getattr(args, "config", None):
        try:
            with open(args.config, encoding="utf-8") as f:
                values = yaml.safe_load(f) or {}
        except OSError as err:
            parser.error(f"{args.config}: cannot read: {err.strerror}")
        except yaml.YAMLError as err:
            parser.error(f"{args.config}: not valid YAML: {err}")
        if not isinstance(values, dict):
            parser.error(f"{args.config}: expected a mapping of option names to values")
        known = {a.dest for a in parser._actions}
        unknown = sorted(set(values) - known)
        if unknown:
            parser.error(f"{args.config}: unknown options: {', '.join(unknown)}")
        parser.set_defaults(**values)
        args = parser.parse_args(argv)
    return args
