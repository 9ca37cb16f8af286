"""onmt_lite_train: train a model from a YAML config (OpenNMT-py style keys)."""
import argparse
import sys

import yaml

from onmt_lite.train.trainer import average_checkpoints, last_checkpoints, train


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="onmt_lite_train", description=__doc__,
                                     prefix_chars="-")
    parser.add_argument("-config", "--config", required=True, help="YAML training config")
    parser.add_argument("-train_steps", "--train_steps", type=int, help="override train_steps")
    parser.add_argument("-train_from", "--train_from", help="resume from this checkpoint")
    parser.add_argument("-gpu", "--gpu", type=int, default=-1, help="GPU id (-1: CPU)")
    parser.add_argument("-average_last", "--average_last", type=int, default=0,
                        help="after training, average the last N checkpoints")
    parser.add_argument("-average_output", "--average_output",
                        help="path of the averaged model (default <save_model>_avg.pt)")
    parser.add_argument("-no_progress", "--no_progress", action="store_true",
                        help="no progress bar")
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
        last = train(config, device=device, progress=not args.no_progress)
        if args.average_last > 0:
            paths = last_checkpoints(config.get("save_model", "model"), args.average_last)
            out = args.average_output or f"{config.get('save_model', 'model')}_avg.pt"
            average_checkpoints(paths, out)
            print(f"averaged {len(paths)} checkpoints into {out}", file=sys.stderr)
    except ValueError as err:
        print(f"onmt_lite_train: {err}", file=sys.stderr)
        return 2
    print(last)
    return 0


if __name__ == "__main__":
    sys.exit(main())
