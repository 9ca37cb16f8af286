"""onmt_lite_evaluate: corpus BLEU and chrF of a hypothesis file (sacrebleu)."""
import argparse
import json
import sys

from onmt_lite.corpus import InputError
from onmt_lite.evaluate import evaluate_files
from onmt_lite.options import Parser, add


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="onmt_lite_evaluate", description=__doc__)
    add(parser, "hyp", required=True, help="hypothesis file (e.g. translate.py -output)")
    add(parser, "ref", required=True, nargs="+", help="one or more reference files")
    add(parser, "tokenize", default="13a", choices=["none", "13a", "intl"],
        help="sacrebleu tokenizer for BLEU (none for pre-tokenized text such as Multi30k .lc.tok)")
    add(parser, "lowercase", action="store_true", help="case-insensitive scores")
    add(parser, "metrics", nargs="+", default=["bleu", "chrf"], choices=["bleu", "chrf"])
    add(parser, "json", action="store_true", help="print one JSON object instead of text")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        scores = evaluate_files(args.hyp, args.ref, tokenize=args.tokenize,
                                lowercase=args.lowercase, metrics=args.metrics)
    except InputError as err:
        print(f"onmt_lite_evaluate: error: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({s.metric: {"score": round(s.score, 2), "signature": s.signature}
                          for s in scores}))
    else:
        for s in scores:
            print(f"{s.text}  ({s.signature})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
