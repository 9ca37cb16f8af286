#!/usr/bin/env python
"""Translate a file with an encoder-decoder checkpoint: see README.md."""
import sys

from onmt_lite.cli.translate import main

if __name__ == "__main__":
    sys.exit(main())
