"""A model's translator, built in a process of its own.

The server's own process never imports torch (it would hold ~185 MiB resident for it): a
spawned process builds the model's translator (build_translator), writes it to the file that
every lane maps (weights.py), and sends the server what it needs of it: how to read a request's
lines (SourceReader, with the model's tokenizer), the search's sizes, the weights' bytes and
whether its searches take sentences. What loading leaves behind (the checkpoint read, its
conversion) goes with that process. The server's first model is built in a child that process
forks once it has imported torch; the process then goes on as the first lane (Build's
``then_lane``), so the first answer waits for one lane's start less.

``-compile``: building a model's programs takes a minute or more where the compile cache does
not hold them yet, and seconds where it does. The first process loads those the cache holds
(``compile_if_cached``); where it lacks any, the server does not wait for them: the model
loads on the uncompiled fast path and answers at once, while a second such process builds the
compiled translator, which fills the compile cache. The model then decodes through it
(ServedModel swaps its batcher: new sentences take the programs, those on the lanes finish
where they are). The compiler and its memory stay in that process.
"""
import logging
import multiprocessing
import os
import signal
import sys
from dataclasses import dataclass
from typing import Optional

from onmt_lite.parent_watch import end_with_parent
from onmt_lite.serve.lanes import Lane, how_ended
from onmt_lite.serve.limits import SearchShape
from onmt_lite.translate.sources import SourceReader


@dataclass(frozen=True)
class Built:
    """What the server keeps of a model's translator. ``path``: the file of it that the lanes
    map (None where it cannot be written: each lane builds its own from the options);
    ``compiled``: it decodes through compiled programs; ``compile_later``: a -compile model's
    first build, uncompiled because the compile cache lacked programs that a compiler here
    can build."""
    source: SourceReader
    shape: Optional[SearchShape]
    weights: int  # bytes
    joinable: bool
    path: Optional[str]
    compiled: bool
    compile_later: bool = False


class BuildFailed(Exception):
    """A model that did not load; the message says why."""


def first_build(options: dict) -> dict:
    """The options of a model's first build: a -compile model's programs (and a model stored
    in int8's: ``compile_stored_int8``) only where the compile cache holds them all (else the
    uncompiled fast path, which answers meanwhile)."""
    return dict(options, compile_if_cached=True) \
        if options.get("compile") or options.get("compile_stored_int8") else options


class Build:
    """The translator of ``options`` being built, and written to ``path``, by a process of its
    own; ``result`` waits for it. With ``then_lane`` the process goes on as a lane once it has
    built the model (``lane``): the server's first model then waits for one lane's start
    (an interpreter and torch, ~1.2 s) less."""

    def __init__(self, options: dict, path: str, name: str, then_lane: bool = False):
        context = multiprocessing.get_context("spawn")  # the server has threads
        self.then_lane = then_lane
        self.conn, child = context.Pipe(duplex=then_lane)
        self.process = context.Process(target=_build, args=(child, options, path, name,
                                                            os.getpid(), then_lane),
                                       daemon=True, name=f"onmt_lite-build-{name}")
        self.process.start()
        child.close()

    def result(self) -> Built:
        """The model built; BuildFailed says why not (also when the process was ended)."""
        try:
            kind, value = self.conn.recv()
        except (EOFError, OSError):
            self.conn.close()
            self.process.join()
            raise BuildFailed(f"the process that built it ended ({how_ended(self.process)})") \
                from None
        if kind == "failed" or not self.then_lane:
            self.conn.close()
            self.process.join()
        if kind == "failed":
            raise BuildFailed(value)
        return value

    def lane(self):
        """The process, after ``result``, as a lane (lanes.Lane; LaneError if it failed)."""
        return Lane((self.process, self.conn))

    def stop(self) -> None:
        self.process.terminate()


def _build(conn, options: dict, path: str, name: str, server: int, then_lane: bool) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server ends it itself (Ctrl-C included)
    end_with_parent(server)  # even when it is killed
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="[%(asctime)s %(levelname)s] %(message)s")
    if not then_lane:
        _send(conn, _attempt(options, path, name))
        return
    # torch first, then the model built in a forked child: this process, a lane next, keeps
    # none of what building leaves in memory (58 MiB more of heap than the other lane's, where
    # it built the model itself)
    from onmt_lite.serve import lane_process
    fork = hasattr(os, "fork")  # (where there is none, it builds the model itself)
    if _send(conn, _forked(options, path, name) if fork else _attempt(options, path, name)):
        lane_process.serve(conn)


def _attempt(options: dict, path: str, name: str) -> tuple:
    try:
        return "built", _built(options, path, name)
    except Exception as err:  # noqa: BLE001 - the server says why the model failed
        return "failed", f"{type(err).__name__}: {err}"


def _forked(options: dict, path: str, name: str) -> tuple:
    """_attempt in a forked child (the process has no other thread that matters: its parent
    watch, which the child starts again)."""
    parent = os.getpid()
    read, write = multiprocessing.Pipe(duplex=False)
    child = os.fork()
    if child == 0:
        try:
            end_with_parent(parent)
            _send(write, _attempt(options, path, name))
        finally:
            os._exit(0)
    write.close()
    try:
        message = read.recv()
    except EOFError:
        message = "failed", "the process that built it ended"
    os.waitpid(child, 0)
    return message


def _send(conn, message: tuple) -> bool:
    """Sends ``message``; whether the model was built and sent."""
    try:
        conn.send(message)
    except Exception as err:  # noqa: BLE001 - a tokenizer that does not pickle
        conn.send(("failed", f"its tokenizer cannot be sent to the server ({type(err).__name__}"
                             f": {err})"))
        return False
    return message[0] == "built"


def _built(options: dict, path: str, name: str) -> Built:
    from onmt_lite.models import aot
    from onmt_lite.models.inference import has_programs
    from onmt_lite.serve.weights import weights_bytes, write_translator
    from onmt_lite.translate.build import build_translator
    translator = build_translator(options)
    model = translator.model
    compiled = translator.compiles and has_programs(model)
    # a -compile build that compiled nothing (no compiler: build_translator said why) is not
    # served, the model decodes on as it does; but a first build is served uncompiled
    written = (compiled or not translator.compiles or options.get("compile_if_cached")) \
        and write_translator(translator, path, name)
    later = bool(options.get("compile_if_cached")) and translator.compiles and not compiled \
        and aot.compiler_problem() is None
    return Built(translator.source_reader, SearchShape.of(model), weights_bytes(model),
                 translator.joinable(), path if written else None, compiled, later)
