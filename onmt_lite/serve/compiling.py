"""``-compile`` in a server: a model's programs built beside it while it answers uncompiled.

Building a model's programs takes a minute or more where the compile cache does not hold them
yet, and seconds where it does. The server does not wait for them: the model loads on the
uncompiled fast path (the same layers and precision) and answers at once, while a process of its
own (spawned: the server has threads) builds the compiled translator, which fills the compile
cache, and writes it where the lanes will map it (weights.py). The model then decodes through it
(ServedModel swaps its batcher: new sentences take the programs, those on the lanes finish where
they are). The compiler and its memory stay in that process, which ends when it is done.
"""
import logging
import multiprocessing
import os
import signal
import sys

from onmt_lite.parent_watch import end_with_parent

# How the building process ends: its file written; compiled but not writable (each lane then
# builds its own copy, from the compile cache); not compiled (no compiler, or torch could not
# export the model: build_translator said why, and the model stays uncompiled).
WRITTEN, NOT_WRITTEN, NOT_COMPILED = 0, 3, 4


def uncompiled(options: dict) -> dict:
    """The options of the model's uncompiled fast path, which answers meanwhile."""
    return dict(options, compile=False, fast=True)


def start(options: dict, path: str, name: str) -> multiprocessing.Process:
    """Starts building the compiled translator of ``options`` into ``path``; the process's exit
    code says how it ended (WRITTEN, NOT_WRITTEN, NOT_COMPILED; anything else: it failed)."""
    context = multiprocessing.get_context("spawn")
    process = context.Process(target=_build, args=(options, path, name, os.getpid()),
                              daemon=True, name="onmt_lite-compile")
    process.start()
    return process


def _build(options: dict, path: str, name: str, server: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server ends it itself (Ctrl-C included)
    end_with_parent(server)  # even when it is killed
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="[%(asctime)s %(levelname)s] %(message)s")
    from onmt_lite.models.inference import compiled_step
    from onmt_lite.serve.weights import write_translator
    from onmt_lite.translate.build import build_translator
    translator = build_translator(options)
    model = translator.model
    if all(compiled_step(part) is None and part.compiled_encoder is None
           for part in getattr(model, "models", [model])):
        sys.exit(NOT_COMPILED)
    sys.exit(WRITTEN if write_translator(translator, path, name) else NOT_WRITTEN)
