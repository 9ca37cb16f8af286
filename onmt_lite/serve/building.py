"""A model's translator, built in a process of its own.

The server's own process never imports torch (it would hold ~185 MiB resident for it): a
spawned process builds the model's translator (build_translator), writes it to the file that
every lane maps (weights.py), and sends the server what it needs of it: how to read a request's
lines (SourceReader, with the model's tokenizer), the search's sizes, the weights' bytes and
whether its searches take sentences. What loading leaves behind (the checkpoint read, its
conversion) goes with that process.

``-compile``: building a model's programs takes a minute or more where the compile cache does
not hold them yet, and seconds where it does. The server does not wait for them: the model
loads on the uncompiled fast path (the same layers and precision) and answers at once, while a
second such process builds the compiled translator, which fills the compile cache. The model
then decodes through it (ServedModel swaps its batcher: new sentences take the programs, those
on the lanes finish where they are). The compiler and its memory stay in that process.
"""
import logging
import multiprocessing
import os
import signal
import sys
from dataclasses import dataclass
from typing import Optional

from onmt_lite.parent_watch import end_with_parent
from onmt_lite.serve.limits import SearchShape
from onmt_lite.translate.sources import SourceReader


@dataclass(frozen=True)
class Built:
    """What the server keeps of a model's translator. ``path``: the file of it that the lanes
    map (None where it cannot be written: each lane builds its own from the options);
    ``compiled``: it decodes through compiled programs."""
    source: SourceReader
    shape: Optional[SearchShape]
    weights: int  # bytes
    joinable: bool
    path: Optional[str]
    compiled: bool


class BuildFailed(Exception):
    """A model that did not load; the message says why."""


def uncompiled(options: dict) -> dict:
    """The options of a -compile model's uncompiled fast path, which answers meanwhile."""
    return dict(options, compile=False, fast=True)


class Build:
    """The translator of ``options`` being built, and written to ``path``, by a process of its
    own; ``result`` waits for it."""

    def __init__(self, options: dict, path: str, name: str):
        context = multiprocessing.get_context("spawn")  # the server has threads
        self.conn, child = context.Pipe(duplex=False)
        self.process = context.Process(target=_build, args=(child, options, path, name,
                                                            os.getpid()),
                                       daemon=True, name=f"onmt_lite-build-{name}")
        self.process.start()
        child.close()

    def result(self) -> Built:
        """The model built; BuildFailed says why not (also when the process was ended)."""
        try:
            kind, value = self.conn.recv()
        except (EOFError, OSError):
            self.process.join()
            raise BuildFailed(f"the process that built it ended ({_how(self.process)})") \
                from None
        finally:
            self.conn.close()
        self.process.join()
        if kind == "failed":
            raise BuildFailed(value)
        return value

    def stop(self) -> None:
        self.process.terminate()


def _how(process) -> str:
    code = process.exitcode
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def _build(conn, options: dict, path: str, name: str, server: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server ends it itself (Ctrl-C included)
    end_with_parent(server)  # even when it is killed
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="[%(asctime)s %(levelname)s] %(message)s")
    try:
        built = _built(options, path, name)
    except Exception as err:  # noqa: BLE001 - the server says why the model failed
        conn.send(("failed", f"{type(err).__name__}: {err}"))
        return
    try:
        conn.send(("built", built))
    except Exception as err:  # noqa: BLE001 - a tokenizer that does not pickle
        conn.send(("failed", f"its tokenizer cannot be sent to the server ({type(err).__name__}"
                             f": {err})"))


def _built(options: dict, path: str, name: str) -> Built:
    from onmt_lite.models.inference import compiled_step
    from onmt_lite.serve.weights import weights_bytes, write_translator
    from onmt_lite.translate.build import build_translator
    translator = build_translator(options)
    model = translator.model
    compiled = bool(options.get("compile")) and any(
        compiled_step(part) is not None or part.compiled_encoder is not None
        for part in getattr(model, "models", [model]))
    # a -compile build that compiled nothing (no compiler: build_translator said why) is not
    # served: the model decodes on as it does
    written = (compiled or not options.get("compile")) and write_translator(translator, path,
                                                                              name)
    return Built(translator.source_reader, SearchShape.of(model), weights_bytes(model),
                 translator.joinable(), path if written else None, compiled)
