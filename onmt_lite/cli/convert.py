"""onmt_lite_convert: write an OpenNMT-py 3.x checkpoint or a Hugging Face Marian directory as a
native onmt_lite checkpoint (a Marian model keeps its tokenizer and generation defaults; a model
over subword pieces keeps the subword model files its transform reads)."""
import argparse
import os
import sys

from onmt_lite.checkpoint import CheckpointError, load_model, save_checkpoint
from onmt_lite.errors import OptionError
from onmt_lite.options import Parser, add
from onmt_lite.transforms import (
    TransformError,
    TransformOptionError,
    read_subword_models,
    resolve,
    subword_model_files,
)

SIDES = ("src_subword_model", "tgt_subword_model")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="onmt_lite_convert", description=__doc__)
    add(parser, "model", required=True,
        help="OpenNMT-py (or onmt_lite) checkpoint, or Hugging Face Marian directory")
    add(parser, "output", required=True, help="native onmt_lite checkpoint to write")
    add(parser, "half", action="store_true", help="store weights in fp16 (loaded back as fp32)")
    for name in SIDES:
        add(parser, name,
            help=f"the {name[:3]} side's subword model file to keep in the checkpoint "
                 "(default: the one the checkpoint keeps or names, looked for as translation "
                 "looks for it)")
    return parser


def subword_models(args, ckpt) -> dict:
    """The subword model files the output keeps: each one given (which the output then names),
    else the one the checkpoint keeps, else the one it names, where found; a file not found
    gets a warning (the output names it without keeping it, as the input did)."""
    given = {name: getattr(args, name) for name in SIDES if getattr(args, name)}
    ckpt.opt.update(given)
    files = subword_model_files(ckpt.opt)
    unused = sorted(set(given) - set(files))
    if unused:
        transforms = ", ".join(ckpt.opt.get("transforms") or []) or "none"
        raise TransformOptionError(f"-{unused[0]}: the transforms of {args.model} ({transforms}) read "
                             f"no {unused[0][:3]} subword model")
    kept, found = {}, {}
    for name, path in files.items():
        if name in given:
            found[name] = path
        elif name in ckpt.subword_models:
            kept[name] = ckpt.subword_models[name]
        elif os.path.isfile(place := resolve(path, args.model, name)):
            found[name] = place
        else:
            print(f"onmt_lite_convert: warning: {path}: no such subword model ({place.origin}); "
                  f"{args.output} names it without keeping it", file=sys.stderr)
    return {**kept, **read_subword_models(found)}


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        model, ckpt = load_model(args.model)
        if ckpt.origin in ("ctranslate2", "argos"):  # its position tables and added rows
            raise CheckpointError(f"{args.model}: a CTranslate2 model or Argos package is read "
                                  "as it is (translate.py -model); convert does not write it as "
                                  "one file")
        kept = subword_models(args, ckpt)
    except (CheckpointError, TransformError) as err:
        print(f"onmt_lite_convert: error: {err}", file=sys.stderr)
        return 2 if isinstance(err, OptionError) else 1
    save_checkpoint(args.output, model, ckpt.src_vocab, ckpt.tgt_vocab, ckpt.opt, half=args.half,
                    generation=ckpt.generation, tokenizer=ckpt.tokenizer, subword_models=kept)
    keeping = sorted({ckpt.opt[name] for name in kept})
    print(f"{args.model} ({ckpt.origin}) -> {args.output}"
          + (f", keeping {', '.join(keeping)}" if keeping else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
