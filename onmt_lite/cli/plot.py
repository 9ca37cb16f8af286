"""onmt_lite plot: draw the attention of an -attn_dump file, one PNG per sentence."""
import argparse
import json
import sys

from onmt_lite.cli.options import Parser, add
from onmt_lite.corpus import InputError, iter_lines
from onmt_lite.translate.attention_plot import PlotError, plot_attention, plot_path, prepare_folder


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="onmt_lite plot", description=__doc__)
    add(parser, "attn_dump", required=True, help="JSON lines written by translate.py -attn_dump")
    add(parser, "output", required=True, help="folder for the pictures (created if missing)")
    return parser


def _records(path: str):
    for number, line in enumerate(iter_lines(path), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            fields = record["index"], record["src"], record["pred"], record["attention"]
        except (ValueError, KeyError, TypeError):
            raise InputError(f"{path}:{number}: not an -attn_dump record (JSON with index, src, "
                             "pred and attention)") from None
        yield fields


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        prepare_folder(args.output)
        count = 0
        for index, src, pred, attention in _records(args.attn_dump):
            plot_attention(src, pred, attention, plot_path(args.output, index))
            count += 1
    except (InputError, PlotError) as err:
        print(f"onmt_lite plot: error: {err}", file=sys.stderr)
        return 1
    print(f"{count} pictures in {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
