"""``python -m onmt_lite {translate,train,evaluate,convert,plot,serve} ...`` (also the
``onmt_lite`` command)."""
import sys

from onmt_lite.cli import convert, evaluate, plot, serve, train, translate

COMMANDS = {"translate": translate.main, "train": train.main, "evaluate": evaluate.main,
            "convert": convert.main, "plot": plot.main, "serve": serve.main}
USAGE = f"""usage: python -m onmt_lite {{{','.join(COMMANDS)}}} [options]

  translate   translate a file with a checkpoint (the same as translate.py)
  train       train a model from a YAML config
  evaluate    BLEU and chrF of a translation against references
  convert     write an OpenNMT-py checkpoint as a native one
  plot        draw the attention of an -attn_dump file, one picture per sentence
  serve       a translation server: OpenNMT-py's and LibreTranslate's HTTP APIs, a web page

python -m onmt_lite COMMAND -h shows a command's options."""


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if not argv or argv[0] not in COMMANDS:
        print(USAGE, file=sys.stderr)
        return 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
