"""onmt_lite_train: train a model from a YAML config (OpenNMT-py style keys)."""
import argparse
import sys

import torch

from onmt_lite.cli.signals import Stopped, stop_on_signals
from onmt_lite.errors import OptionError
from onmt_lite.options import Parser, add, integer, read_config
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
        config = read_config(args.config)
    except OptionError as err:
        print(f"onmt_lite_train: error: {err}", file=sys.stderr)
        return 2
    for key in ("train_steps", "train_from"):
        if getattr(args, key) is not None:
            config[key] = getattr(args, key)
    if args.gpu >= 0 and not torch.cuda.is_available():
        print(f"onmt_lite_train: error: -gpu {args.gpu}: no CUDA device is visible (-gpu -1 "
              "trains on the CPU)", file=sys.stderr)
        return 1
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
    except OptionError as err:  # a config value or combination refused: as -config's errors
        print(f"onmt_lite_train: error: {err}", file=sys.stderr)
        return 2
    except ValueError as err:  # a missing or unreadable corpus or checkpoint
        print(f"onmt_lite_train: error: {err}", file=sys.stderr)
        return 1
    print(last)
    return 0


if __name__ == "__main__":
    sys.exit(main())
