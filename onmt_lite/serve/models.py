"""The served models: each loads (at start-up or at its first request), translates through its
Batcher, unloads after its idle timeout, and can be cloned with other options.

The models share the server's lanes (pool.py) and each model's weights are held once, in a file
every lane maps (weights.py). Within ``-max_memory`` (limits.model_memory: the weights once,
and a quarter of them in each lane), the least recently used models are unloaded to make room
for one that loads; an unloaded model loads again at its next request (Residency)."""
import asyncio
import dataclasses
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from onmt_lite.serve import building
from onmt_lite.serve.batcher import Batcher, Scheduling, SentenceFailed, Settings, Stopped
from onmt_lite.serve.config import ConfError, ModelSpec, check_opt, translate_options
from onmt_lite.serve.limits import MIB, LimitError, SearchLimits, SearchShape, model_memory
from onmt_lite.serve.metrics import Metrics
from onmt_lite.serve.pool import LanePool
from onmt_lite.serve.weights import WeightFiles, remove
from onmt_lite.translate.sources import SourceReader

logger = logging.getLogger("onmt_lite")

class ModelUnavailable(Exception):
    """A model that failed to load, or is stopping; the message says which and why."""


class TranslationFailed(Exception):
    """A sentence that could not be decoded (its search failed, or it ended the lanes that
    decoded it); the message says why."""


@dataclass
class Sentence:
    """A translated sentence: its n-best texts and scores, best first; when asked for, its
    source tokens, the best hypothesis' tokens and attention, and each hypothesis' alignment
    (Pharaoh pairs and their attention weights, see lane_process.alignment)."""
    texts: List[str]
    scores: List[float]
    src_tokens: List[str] = field(default_factory=list)
    tgt_tokens: List[str] = field(default_factory=list)
    attention: Optional[List[List[float]]] = None
    alignments: Optional[List[tuple]] = None


class Residency:
    """What the server's models share: the lanes (started when the first model loads), the
    files of their weights, and the bound on the memory of the models loaded (``max_memory``
    MiB, 0: none): a model that loads first unloads the least recently used others (idle ones
    first) until it fits. ``models``: the server's models, as a function."""

    def __init__(self, lanes: int, max_memory: int = 0, models=lambda: [], metrics=None):
        self.lanes, self.max_memory, self.models = lanes, max_memory, models
        self.metrics = metrics
        self.pool: Optional[LanePool] = None
        self.weights = WeightFiles()
        self.lock = threading.Lock()  # one model makes room and starts at a time

    def serve(self, model: "ServedModel", options: dict, built: building.Built,
              lane=None) -> tuple:
        """A Batcher for ``model`` on the server's lanes (``options``: its translator's, which
        a lane builds where ``built`` has no file of it), room made for it: (batcher, the
        model's memory). Its file is removed where it is not served. ``lane``: the process
        that built it, to be the first of the lanes (stopped where they run already, or do
        not start)."""
        memory = model_memory(built.weights, self.lanes, built.path is not None)
        try:
            with self.lock:
                self._make_room(model, memory)
                if self.pool is None:
                    self.pool, lane = LanePool(self.lanes, lane), None
                batcher = Batcher(options, model.scheduling, model._on_batch,
                                  model._on_restart, pool=self.pool, weights=built.path,
                                  joinable=built.joinable)
        except BaseException:
            remove(built.path)
            raise
        finally:
            if lane is not None:  # another model's load started the lanes meanwhile
                lane.stop()
        return batcher, memory

    def held(self) -> int:
        """The bytes the models loaded hold (model_memory)."""
        return sum(m.memory for m in self.models() if m.state == "ready")

    def _make_room(self, model: "ServedModel", need: int) -> None:
        """Unloads the least recently used models (idle ones first) until ``need`` bytes more
        fit within max_memory; one line names each."""
        if not self.max_memory:
            return
        bound = self.max_memory * MIB
        others = [m for m in self.models() if m is not model and m.state == "ready"]
        held = sum(m.memory for m in others)
        for other in sorted(others, key=lambda m: (m.busy(), m.used)):
            if held + need <= bound:
                break
            memory = other.memory
            if not other.unload(wait=False):
                continue  # loading or unloading meanwhile
            logger.info("%s unloaded to make room for %s (-max_memory %d MiB: %.0f MiB were "
                        "held, %.0f MiB more wanted)", other.spec.describe(),
                        model.spec.describe(), self.max_memory, held / MIB, need / MIB)
            held -= memory
            if self.metrics is not None:
                self.metrics.models_dropped.labels(str(other.id)).inc()
        if held + need > bound:
            logger.warning("%s needs about %.0f MiB beside %.0f MiB of models in use, over "
                           "-max_memory %d MiB", model.spec.describe(), need / MIB, held / MIB,
                           self.max_memory)

    def stop(self) -> None:
        if self.pool is not None:
            self.pool.stop()
            self.pool = None
        self.weights.close()


class ServedModel:
    """One model of the server. ``state``: unloaded, loading, ready or failed (``error``).
    ``host``: what it shares with the server's other models (its lanes, the memory bound);
    without one, a Residency of its own."""

    def __init__(self, spec: ModelSpec, scheduling: Scheduling = Scheduling(), metrics=None,
                 limits: SearchLimits = SearchLimits(), host: Optional[Residency] = None):
        self.spec, self.metrics, self.limits = spec, metrics, limits
        self.host = host if host is not None else Residency(scheduling.lanes)
        self.memory = 0  # bytes, while loaded (limits.model_memory)
        self.used = 0.0  # when it last translated or loaded (time.monotonic)
        self.weights: Optional[str] = None  # the file of its translator that the lanes map
        self.options = translate_options(spec)  # refused here, at start-up, not at a request
        limits.check_options(self.options, spec.describe())
        batch_size = spec.opt.get("batch_size", scheduling.batch_size)  # OpenNMT-py's opt
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfError(f"{spec.describe()}: batch_size must be a positive integer")
        limits.check_batch_size(batch_size, spec.describe())
        self.shape: Optional[SearchShape] = None  # the search's sizes, once loaded
        self.scheduling = dataclasses.replace(scheduling, batch_size=batch_size)
        self.report_align = bool(spec.opt.get("report_align", False))
        self.state, self.error, self.load_time = "unloaded", "", 0.0
        self.batcher: Optional[Batcher] = None
        self.source: Optional[SourceReader] = None  # tokenizes its requests, once loaded
        self.lock = threading.Lock()  # loading and unloading
        self.loads = 0  # loads begun: a compilation (-compile) serves only its own
        self.compiler: Optional[building.Build] = None  # its programs' (-compile), while built
        self.timer: Optional[threading.Timer] = None

    @property
    def id(self) -> int:
        return self.spec.id

    @property
    def n_best(self) -> int:
        return self.options.n_best

    @property
    def beam_size(self) -> int:
        return self.options.beam_size

    def load(self) -> None:
        """Loads the model (once; a failure is kept in ``state`` and ``error``): its
        translator is built in a process of its own (building.py). The first model's builder
        then goes on as the first lane and the others start: started beside the builder, they
        made the server's peak 84 MiB higher (three processes with torch at once)."""
        with self.lock:
            if self.state == "ready":
                return
            self.state = "loading"
            self.loads += 1
            start = time.monotonic()
            options = dict(vars(self.options), keep_attention=self.options.replace_unk,
                           inter_threads=1, workers=1, compile_stored_int8=True)
            first = building.first_build(options)
            name = f"model{self.id}"
            then_lane = self.host.pool is None  # the first model: its builder is a lane next
            build = building.Build(first, self.host.weights.path(name), name, then_lane)
            built = lane = None
            try:
                built = build.result()
                self.shape, self.source = built.shape, built.source
                self._check_memory([1])  # a one-token sentence fits
                self.used = time.monotonic()
                lane = build.lane() if then_lane else None
                self.batcher, self.memory = self.host.serve(self, first, built, lane)
                self.weights = built.path
            except Exception as err:  # noqa: BLE001 - the others serve on; this one says why
                if built is not None:  # not served
                    remove(built.path)
                if then_lane and lane is None:  # (serve stops a lane it does not take)
                    build.stop()
                self.state = "failed"
                self.error = str(err) if isinstance(err, building.BuildFailed) else \
                    f"{type(err).__name__}: {err}"
                logger.error("%s failed to load: %s", self.spec.describe(), self.error)
                return
            self.load_time = time.monotonic() - start
            self.state, self.error = "ready", ""
            logger.info("%s loaded in %.2f s (about %.0f MiB)", self.spec.describe(),
                        self.load_time, self.memory / MIB)
            if built.compiled:
                logger.info("%s: its compiled programs are ready (from the compile cache): it "
                            "decodes through them", self.spec.describe())
                self._compiled(True)
            elif options.get("compile") or built.compile_later:
                self._compiled(False)
                if built.compile_later:
                    threading.Thread(target=self._compile, args=(options, self.loads),
                                     daemon=True, name="onmt_lite-compile").start()
        self._reset_timer()

    def _compile(self, options: dict, load: int) -> None:
        """-compile (and a model stored in int8, by default): the model's programs built in a
        process of their own while it answers uncompiled (building.py), then its batcher
        swapped for one that decodes through them; the old one finishes its sentences and
        goes."""
        start, name = time.monotonic(), f"model{self.id}-compiled"
        with self.lock:
            if self.loads != load or self.state != "ready":
                return
            logger.info("%s: its programs are built (or loaded from the compile cache) "
                        "beside it; it answers uncompiled meanwhile", self.spec.describe())
            self.compiler = build = building.Build(options, self.host.weights.path(name), name)
        try:
            built, failure = build.result(), ""
        except building.BuildFailed as err:
            built, failure = None, str(err)
        with self.lock:
            self.compiler = None
            current = self.loads == load and self.state == "ready"
            if built is None or not built.compiled or not current:
                if built is not None:
                    remove(built.path)
                if current and failure:
                    logger.error("%s: -compile: building its programs failed (%s): it decodes "
                                 "uncompiled", self.spec.describe(), failure)
                return
            old, old_weights = self.batcher, self.weights
            try:
                self.batcher, self.memory = self.host.serve(self, options, built)
            except Exception as err:  # noqa: BLE001 - it serves on uncompiled
                logger.error("%s: -compile: its compiled programs could not be served (%s: "
                             "%s): it decodes uncompiled", self.spec.describe(),
                             type(err).__name__, err)
                return
            self.weights = built.path
            logger.info("%s: its compiled programs are ready (%.1f s): it decodes through "
                        "them", self.spec.describe(), time.monotonic() - start)
            self._compiled(True)
        old.stop(True)  # its sentences finish uncompiled
        remove(old_weights)

    def unload(self, drain: bool = True, wait: bool = True) -> bool:
        """Frees the model; sentences queued are finished first (``drain``). Without
        ``wait``, only a ready model that no other thread loads or unloads (to make room for
        another: never waiting for a model that waits for room); False where it was not."""
        if not self.lock.acquire(blocking=wait):
            return False
        try:
            if not wait and self.state != "ready":
                return False
            if self.timer is not None:
                self.timer.cancel()
            if self.compiler is not None:
                self.compiler.stop()
            if self.batcher is not None:
                self.batcher.stop(drain)
            remove(self.weights)
            self.batcher, self.source, self.weights = None, None, None
            if self.state == "ready":
                self.state = "unloaded"
        finally:
            self.lock.release()
        return True

    def _compiled(self, on: bool) -> None:
        if self.metrics is not None:
            self.metrics.compiled.labels(str(self.id)).set(int(on))

    def _reset_timer(self) -> None:
        if self.spec.timeout < 0:
            return
        if self.timer is not None:
            self.timer.cancel()
        self.timer = threading.Timer(self.spec.timeout, self._on_timeout)
        self.timer.daemon = True
        self.timer.start()

    def _on_timeout(self) -> None:
        if self.spec.on_timeout == "unload":  # to_cpu: on CPU there is nothing to move
            logger.info("%s idle for %g s: unloaded", self.spec.describe(), self.spec.timeout)
            self.unload()

    def _on_batch(self, size: int, waits: List[float]) -> None:
        if self.metrics is not None:
            self.metrics.batch(self.id, size, waits)

    def _on_restart(self) -> None:
        if self.metrics is not None:
            self.metrics.lane_restarts.labels(str(self.id)).inc()

    def queued(self) -> int:
        batcher = self.batcher
        return batcher.queued() if batcher is not None else 0

    def busy(self) -> bool:
        """Whether sentences of it wait or decode."""
        batcher = self.batcher
        return batcher is not None and bool(batcher.queued() or batcher.running)

    async def translate(self, lines: List[str], n_best: Optional[int] = None,
                        attention: bool = False) -> List[Sentence]:
        """Each line's translation (loading the model first if needed). Lines with nothing to
        translate give "" and score 0, as OpenNMT-py's server does."""
        n_best = n_best or self.n_best
        batcher, tokens, todo, futures = await self._submit(lines, Settings(n_best, attention))
        waiting = [asyncio.wrap_future(f) for f in futures]
        try:
            done = await asyncio.gather(*waiting)
        except asyncio.CancelledError:  # timed out or the client left: drop its sentences
            threading.Thread(target=batcher.abandon, args=(futures,), daemon=True).start()
            raise
        except Stopped as err:  # the model stopped while they waited
            raise ModelUnavailable(f"{self.spec.describe()}: {err}") from None
        except SentenceFailed as err:
            raise TranslationFailed(f"{self.spec.describe()}: {err}") from None
        finally:
            self._reset_timer()
        empty = [("", [])] * n_best if attention else None
        results = [Sentence([""] * n_best, [0.0] * n_best, toks, alignments=empty)
                   for toks in tokens]
        for i, (texts, scores, tgt_tokens, rows, alignments) in zip(todo, done):
            results[i] = Sentence(texts, scores, tokens[i], tgt_tokens, rows, alignments)
        if self.metrics is not None:
            self.metrics.sentences(self.id, len(lines))
        return results

    async def _submit(self, lines: List[str], settings: Settings) -> tuple:
        """(batcher, each line's tokens, the lines to decode, their futures), the model loaded
        first; loaded again where it was unloaded meanwhile (to make room for another)."""
        for attempt in range(3):
            if self.state != "ready":
                await asyncio.to_thread(self.load)
            batcher, source = self.batcher, self.source
            if self.state != "ready" or batcher is None:
                raise ModelUnavailable(f"{self.spec.describe()} is not available: "
                                       f"{self.error or self.state}")
            self.used = time.monotonic()
            tokens = [source.tokens(line, number) for number, line in enumerate(lines, 1)]
            todo = [i for i, toks in enumerate(tokens) if not source.empty(toks)]
            self._check_memory([len(tokens[i]) for i in todo])
            try:
                return batcher, tokens, todo, batcher.submit([tokens[i] for i in todo], settings)
            except Stopped as err:
                if attempt == 2:
                    raise ModelUnavailable(f"{self.spec.describe()}: {err}") from None

    def _check_memory(self, lengths: List[int]) -> None:
        """Raises LimitError when sentences of sources ``lengths`` tokens long would need more
        search memory than a lane may use for one request (serve -lane_memory)."""
        if self.shape is None or not lengths:
            return
        opt = self.options
        target = opt.max_length if opt.max_length_ratio <= 0 else int(min(
            opt.max_length, max(lengths) * opt.max_length_ratio + 5))
        self.limits.check_memory(self.shape, opt.beam_size, lengths, target,
                                 self.scheduling.batch_size, self.spec.describe())

    def describe(self) -> dict:
        """GET /translator/models' entry, as OpenNMT-py's server gives it."""
        entry = {"model_id": self.id, "opt": self.spec.user_opt,
                 "models": [os.path.relpath(self.spec.path)], "loaded": self.state == "ready",
                 "timeout": self.spec.timeout}
        if self.spec.tokenizer is not None:
            entry["tokenizer"] = self.spec.tokenizer
        if self.spec.src_lang:
            entry["src_lang"], entry["tgt_lang"] = self.spec.src_lang, self.spec.tgt_lang
        if self.state == "failed":
            entry["error"] = self.error
        return entry


class Registry:
    """The server's models by id: the configured ones and their clones, at most
    ``limits.max_models`` in all (never fewer than the configured ones)."""

    def __init__(self, specs: List[ModelSpec], scheduling: Scheduling = Scheduling(),
                 limits: SearchLimits = SearchLimits()):
        self.scheduling, self.limits = scheduling, limits
        self.models: Dict[int, ServedModel] = {}
        self.host = Residency(scheduling.lanes, limits.max_memory,
                              lambda: list(self.models.values()))
        self.metrics = Metrics(self.queued, self.host.held)
        self.host.metrics = self.metrics
        for spec in specs:
            self.models[spec.id] = self._served(spec)
        self.configured = set(self.models)
        self.lock = threading.Lock()  # clones and their removal
        self.cloning = 0  # clones loading
        self.next_id = max(self.models, default=-1) + 1  # a removed clone's id is never reused

    def _served(self, spec: ModelSpec) -> ServedModel:
        return ServedModel(spec, self.scheduling, self.metrics, self.limits, self.host)

    def queued(self) -> int:
        return sum(model.queued() for model in self.models.values())

    def load_at_start(self) -> None:
        for model in self.models.values():
            if model.spec.load:
                model.load()

    def get(self, model_id) -> Optional[ServedModel]:
        return self.models.get(model_id)

    def by_languages(self, source: str, target: str) -> Optional[ServedModel]:
        for model in self.models.values():
            if (model.spec.src_lang, model.spec.tgt_lang) == (source, target):
                return model
        return None

    def clone(self, model_id: int, opt: Optional[dict], timeout: float) -> ServedModel:
        """A new model: model ``model_id``'s checkpoint with other options (OpenNMT-py's
        clone_model; the checkpoint is never the client's to name)."""
        base = self.models[model_id]
        if opt is None:
            opt = dict(base.spec.user_opt)
        opt = check_opt(opt, f"clone of {base.spec.describe()}")
        merged = {k: v for k, v in base.spec.opt.items() if k not in base.spec.user_opt}
        merged.update(opt)  # the tokenizer's transform options stay
        with self.lock:
            bound = max(self.limits.max_models, len(self.configured))
            if len(self.models) + self.cloning >= bound:
                raise LimitError(f"the server holds {len(self.models) + self.cloning} models, "
                                 f"its limit (-max_models {bound}): unload a clone first")
            new_id, self.next_id = self.next_id, self.next_id + 1
            self.cloning += 1
        try:
            spec = ModelSpec(new_id, base.spec.path, merged, base.spec.src_lang,
                             base.spec.tgt_lang, timeout, base.spec.on_timeout, True,
                             base.spec.tokenizer, dict(opt))
            model = self._served(spec)  # its options checked against the limits
            model.load()
            if model.state == "failed":
                raise ModelUnavailable(model.error)
            with self.lock:
                self.models[new_id] = model
        finally:
            with self.lock:
                self.cloning -= 1
        return model

    def unload(self, model_id: int) -> None:
        """Unloads a model; a clone is removed too (a configured model stays listed, and loads
        again at its next request)."""
        model = self.models[model_id]
        model.unload()
        if model_id not in self.configured:
            with self.lock:
                self.models.pop(model_id, None)

    def stop(self) -> None:
        for model in list(self.models.values()):
            model.unload(drain=True)
        self.host.stop()


def default_lanes() -> int:
    """One lane per core (batches side by side on one torch thread each, the fastest layout
    measured for translate.py)."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
               else os.cpu_count() or 1)
