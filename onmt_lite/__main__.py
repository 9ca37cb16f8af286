"""``python -m onmt_lite {translate,train,evaluate,convert} ...``"""
import sys

from onmt_lite.cli import convert, evaluate, train, translate

COMMANDS = {"translate": translate.main, "train": train.main, "evaluate": evaluate.main,
            "convert": convert.main}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m onmt_lite {{{','.join(COMMANDS)}}} ...", file=sys.stderr)
        return 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
