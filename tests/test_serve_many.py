"""Many models on one server: the lanes are shared by every model (each lane loads a model at its
first batch of it, mapping the weights the server wrote once), the least recently used models
are unloaded under -max_memory and load again at their next request, and a lane that dies with
several models on it is replaced for all of them."""
import json
import multiprocessing
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi", reason="the server needs the serve extra (fastapi)")
from fastapi.testclient import TestClient  # noqa: E402

from onmt_lite.serve.app import create_app  # noqa: E402
from onmt_lite.serve.batcher import Scheduling  # noqa: E402
from onmt_lite.serve.config import ModelSpec  # noqa: E402
from onmt_lite.serve.limits import SearchLimits  # noqa: E402
from onmt_lite.serve.models import Registry  # noqa: E402
from onmt_lite.translate.build import build_translator  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "data", "multi30k_en_de_raw.pt")
DEMO = [line for line in open(os.path.join(ROOT, "data", "demo.en"), encoding="utf-8")
        .read().splitlines() if line.strip()]
TINY = os.path.join(ROOT, "tests", "reference", "ct2_tiny")
with open(os.path.join(ROOT, "tests", "reference", "ctranslate2_models.json"),
          encoding="utf-8") as f:
    TINY_LINES = {name: model["lines"] for name, model in json.load(f)["models"].items()}
OPT = {"search": "ctranslate2", "precision": "fp32", "beam_size": 2, "max_length_ratio": 0}


def spec(model_id: int, path: str, pair: tuple, opt: dict) -> ModelSpec:
    return ModelSpec(model_id, path, dict(opt), *pair, load=False, user_opt=dict(opt))


def expected(path: str, lines, opt: dict):
    return [t.output_lines()[0] for t in build_translator({"model": path, **opt})
            .translate(lines)]


def ask(client, model_id: int, line: str) -> str:
    answer = client.post("/translator/translate", json=[{"src": line, "id": model_id}])
    assert answer.status_code == 200, answer.text
    return answer.json()[0][0]["tgt"]


def test_models_share_the_lanes_and_answer_as_translate_py():
    names = sorted(TINY_LINES)  # five tiny CTranslate2 models, one language pair each
    specs = [spec(i, os.path.join(TINY, name), ("en", f"x{i}"), OPT)
             for i, name in enumerate(names)]
    want = {i: dict(zip(TINY_LINES[name], expected(os.path.join(TINY, name), TINY_LINES[name],
                                                   OPT))) for i, name in enumerate(names)}
    registry = Registry(specs, Scheduling(lanes=2))
    asks = [(i, line) for _ in range(3) for i in want for line in want[i]]
    with TestClient(create_app(registry)) as c:
        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(lambda job: ask(c, *job), asks))
        assert got == [want[i][line] for i, line in asks]
        pool = registry.host.pool
        assert len(pool.lanes) == 2  # two lane processes for the five models
        for model in registry.models.values():
            assert [view.lane for view in model.batcher.lanes] == pool.lanes
            assert os.path.exists(model.weights)  # each model's weights, once
        assert len({model.weights for model in registry.models.values()}) == len(names)
        folder = os.path.dirname(registry.get(0).weights)
    assert not os.path.exists(folder)  # gone with the server


def test_the_least_recently_used_model_is_unloaded_to_make_room_and_loads_again():
    """Three copies of the Transformer fixture (about 58 MiB each as -max_memory counts it,
    with two lanes) within 150 MiB: the third to load unloads the least recently used."""
    specs = [spec(i, MODEL, (f"e{i}", "de"), {"max_length_ratio": 0}) for i in range(3)]
    want = dict(zip(DEMO[:3], expected(MODEL, DEMO[:3], {"max_length_ratio": 0})))
    registry = Registry(specs, Scheduling(lanes=2), SearchLimits(max_memory=150))
    with TestClient(create_app(registry)) as c:
        for model_id in (0, 1, 0):
            assert ask(c, model_id, DEMO[model_id]) == want[DEMO[model_id]]
        assert 50 << 20 < registry.get(0).memory < 65 << 20
        first_weights = registry.get(1).weights
        assert ask(c, 2, DEMO[2]) == want[DEMO[2]]  # model 1 is the least recently used
        states = {m.id: m.state for m in registry.models.values()}
        assert states == {0: "ready", 1: "unloaded", 2: "ready"}
        assert not os.path.exists(first_weights)
        assert len(registry.host.pool.models) == 2  # the lanes were told to free it
        assert ask(c, 1, DEMO[1]) == want[DEMO[1]]  # loads again; model 0 makes room now
        assert {m.id: m.state for m in registry.models.values()} == \
            {0: "unloaded", 1: "ready", 2: "ready"}
        metrics = c.get("/metrics").text
        assert 'onmt_lite_models_dropped_total{model="1"} 1.0' in metrics
        assert 'onmt_lite_models_dropped_total{model="0"} 1.0' in metrics


def test_a_lane_that_dies_with_two_models_on_it_is_replaced_for_both():
    """One lane decodes long sentences of the Transformer fixture and has a tiny model loaded:
    it is killed mid-batch; every answer of both models is still the translator's own, and
    the replacement lane serves both."""
    tiny = os.path.join(TINY, "prenorm_float32")
    specs = [spec(0, MODEL, ("en", "de"), {"max_length_ratio": 0}),
             spec(1, tiny, ("en", "xx"), OPT)]
    long = [" ".join(DEMO[i:] + DEMO[:i]) for i in range(4)]
    want_long = expected(MODEL, long, {"max_length_ratio": 0})
    want_tiny = dict(zip(TINY_LINES["prenorm_float32"],
                         expected(tiny, TINY_LINES["prenorm_float32"], OPT)))
    registry = Registry(specs, Scheduling(lanes=1))
    with TestClient(create_app(registry)) as c:
        assert ask(c, 1, TINY_LINES["prenorm_float32"][0]) == \
            want_tiny[TINY_LINES["prenorm_float32"][0]]
        lane = registry.host.pool.lanes[0]
        batcher = registry.get(1).batcher

        def kill_once_decoding():
            deadline = time.monotonic() + 60
            while not (registry.get(0).batcher and registry.get(0).batcher.lanes
                       and registry.get(0).batcher.lanes[0].active) \
                    and time.monotonic() < deadline:
                time.sleep(0.001)
            lane.process.kill()
        killer = threading.Thread(target=kill_once_decoding)
        killer.start()
        with ThreadPoolExecutor(6) as pool:
            longs = [pool.submit(ask, c, 0, line) for line in long]
            tinies = [(line, pool.submit(ask, c, 1, line)) for line in want_tiny for _ in (0, 1)]
            assert [f.result() for f in longs] == want_long
            assert all(f.result() == want_tiny[line] for line, f in tinies)
        killer.join()
        assert lane.process.exitcode == -9
        deadline = time.monotonic() + 60
        while not registry.host.pool.lanes and time.monotonic() < deadline:
            time.sleep(0.05)
        (new,) = registry.host.pool.lanes
        assert new is not lane and [v.lane for v in batcher.lanes] == [new]
        assert [v.lane for v in registry.get(0).batcher.lanes] == [new]
        assert ask(c, 1, TINY_LINES["prenorm_float32"][1]) == \
            want_tiny[TINY_LINES["prenorm_float32"][1]]
        metrics = c.get("/metrics").text
        assert 'onmt_lite_lane_restarts_total{model="0"} 1.0' in metrics
        assert 'onmt_lite_lane_restarts_total{model="1"} 1.0' in metrics


def test_a_lane_loads_a_model_when_told_not_at_its_first_batch(tmp_path):
    """A lane told to load a model ("load", after its source) holds it before any batch; a
    load that fails says nothing then, and the model's first batch fails naming why."""
    from conftest import tiny_checkpoint

    from onmt_lite.serve.lane_process import _Models
    from onmt_lite.serve.lanes import ModelSource

    class Pipe:
        def __init__(self):
            self.sent = []

        def send(self, message):
            self.sent.append(message)
    pipe = Pipe()
    models = _Models(pipe)
    models.receive(("model", "a", ModelSource({"model": tiny_checkpoint(tmp_path / "a.pt")})))
    models.receive(("load", "a"))
    assert list(models.lanes) == ["a"] and pipe.sent == []
    models.receive(("model", "b", ModelSource({"model": str(tmp_path / "absent.pt")})))
    models.receive(("load", "b"))
    assert list(models.lanes) == ["a"] and pipe.sent == []
    models.receive(("batch", "b", 7, [["a", "b"]], 1, False))
    assert pipe.sent[0][:3] == ("error", "b", 7)
    assert "the model did not load in a lane" in pipe.sent[0][3]


def test_the_first_models_builder_goes_on_as_a_lane_and_a_failed_build_leaves_nothing(tmp_path):
    """A model is built in a process of its own; the first model's builder then serves as the
    first lane (the first answer waits for one lane's start less), the others start beside it.
    A model that fails to build says why and leaves no process and no lanes behind."""
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    name = sorted(TINY_LINES)[0]
    specs = [spec(0, str(bad), ("en", "x0"), OPT), spec(1, os.path.join(TINY, name),
                                                       ("en", "x1"), OPT)]
    registry = Registry(specs, Scheduling(lanes=2))
    try:
        failed = registry.get(0)
        failed.load()
        assert failed.state == "failed" and "bad.pt" in failed.error
        assert registry.host.pool is None and not [
            p for p in multiprocessing.active_children() if p.name == "onmt_lite-build-model0"]
        registry.get(1).load()
        lanes = registry.host.pool.lanes
        assert len(lanes) == 2 and lanes[0].process.name == "onmt_lite-build-model1"
        with TestClient(create_app(registry)) as c:
            line = TINY_LINES[name][0]
            assert ask(c, 1, line) == expected(os.path.join(TINY, name), [line], OPT)[0]
    finally:
        registry.stop()


def test_a_build_whose_process_is_ended_fails_saying_how(tmp_path):
    """A model's building process that ends before it answers (here: SIGTERM, as unloading a
    -compile model mid-build does) gives BuildFailed naming how it ended, not a hang."""
    from onmt_lite.serve.building import Build, BuildFailed
    build = Build({"model": os.path.join(TINY, sorted(TINY_LINES)[0])},
                  str(tmp_path / "model.pt"), "model0")
    build.stop()
    with pytest.raises(BuildFailed, match="ended \\(killed by SIGTERM\\)"):
        build.result()
    assert not (tmp_path / "model.pt").exists()
