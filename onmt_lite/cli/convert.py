"""onmt_lite_convert: write an OpenNMT-py 3.x checkpoint or a Hugging Face Marian directory as a
native onmt_lite checkpoint (a Marian model keeps its tokenizer and generation defaults)."""
import argparse
import sys

from onmt_lite.checkpoint import CheckpointError, load_model, save_checkpoint
from onmt_lite.cli.options import Parser, add


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="onmt_lite_convert", description=__doc__)
    add(parser, "model", required=True,
        help="OpenNMT-py (or onmt_lite) checkpoint, or Hugging Face Marian directory")
    add(parser, "output", required=True, help="native onmt_lite checkpoint to write")
    add(parser, "half", action="store_true", help="store weights in fp16 (loaded back as fp32)")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        model, ckpt = load_model(args.model)
    except CheckpointError as err:
        print(f"onmt_lite_convert: error: {err}", file=sys.stderr)
        return 1
    save_checkpoint(args.output, model, ckpt.src_vocab, ckpt.tgt_vocab, ckpt.opt, half=args.half,
                    generation=ckpt.generation, tokenizer=ckpt.tokenizer)
    print(f"{args.model} ({ckpt.origin}) -> {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
