"""``python -m onmt_lite {translate,train,evaluate,convert,plot,serve} ...`` (also the
``onmt_lite`` command)."""
import importlib
import sys

# each command's module (onmt_lite.cli.NAME) is imported when it runs: one that needs no torch
# (evaluate, serve's own process) starts without it
COMMANDS = ("translate", "train", "evaluate", "convert", "plot", "serve")
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
    return importlib.import_module(f"onmt_lite.cli.{argv[0]}").main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
