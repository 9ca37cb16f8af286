"""onmt_lite_train: train a model from a YAML config (OpenNMT-py style keys)."""
import argparse
import sys

import yaml

from onmt_lite.cli.options import Parser, add, integer
from onmt_lite.cli.signals import Stopped, stop_on_signals
from onmt_lite.train.trainer import average_checkpoints, last_checkpoints, train


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="onmt_lite_train", description=__doc__)
    add(parser, "config", required=True, help="YAML training config")
    add(parser, "train_steps", type=integer(1), help="override train_steps")
    add(parser, "train_from", help="resume from this checkpoint")
    add(parser, "gpu", type=integer(-1), default=-1, help="GPU id (-1: CPU)")
    add(parser, "average_last", type=integer(0), default=0,
        help="after training, average the last N checkpoints")
    add(parser, "average_output", help="path of the averaged model (default <save_model>_avg.pt)")
    add(parser, "no_progress", action="store_true", help="no progress bar")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with open(args.config, encoding="utf-8") as f:
            config = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as err:
        print(f"onmt_lite_train: {args.config}: {err}", file=sys.stderr)
        return 2
    for key in ("train_steps", "train_from"):
        if getattr(args, key) is not None:
            config[key] = getattr(args, key)
    device = f"cuda:{args.gpu}" if args.gpu >= 0 else "cpu"
    try:
        with stop_on_signals():
            last = train(config, device=device,
                         progress=not args.no_progress and sys.stderr.isatty())
        if args.average_last > 0:
            paths = last_checkpoints(config.get("save_model", "model"), args.average_last)
            out = args.average_output or f"{config.get('save_model', 'model')}_avg.pt"
            average_checkpoints(paths, out)
            print(f"averaged {len(paths)} checkpoints into {out}", file=sys.stderr)
    except Stopped as stop:  # checkpoints already written stay; -train_from resumes
        print(f"onmt_lite_train: stopped by {stop.name}", file=sys.stderr)
        return stop.exit_status
    except ValueError as err:
        print(f"onmt_lite_train: {err}", file=sys.stderr)
        return 2
    print(last)
    return 0


if __name__ == "__main__":
    sys.exit(main())
