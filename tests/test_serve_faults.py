"""What a stranger may take from the server, and the faults it survives: management endpoints
behind keys, a bound on models and on every option a client or a conf.json sets, the search
memory of a request checked before any lane grows."""
import os

import pytest

fastapi = pytest.importorskip("fastapi", reason="the server needs the serve extra (fastapi)")
from fastapi.testclient import TestClient  # noqa: E402

from onmt_lite.serve.app import create_app  # noqa: E402
from onmt_lite.serve.batcher import Scheduling  # noqa: E402
from onmt_lite.serve.config import ModelSpec  # noqa: E402
from onmt_lite.serve.limits import LimitError, SearchLimits  # noqa: E402
from onmt_lite.serve.models import Registry  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "data", "multi30k_en_de_raw.pt")
DEMO = [line for line in open(os.path.join(ROOT, "data", "demo.en"), encoding="utf-8")
        .read().splitlines() if line.strip()]


def serving(keys=None, admin_keys=None, lanes=1, opt=None, **limits):
    spec = ModelSpec(0, MODEL, dict(opt or {}), "en", "de", user_opt=dict(opt or {}))
    registry = Registry([spec], Scheduling(lanes=lanes), SearchLimits(**limits))
    return registry, TestClient(create_app(registry, api_keys=keys, admin_keys=admin_keys))


def test_management_endpoints_need_an_admin_key_when_keys_are_configured():
    registry, client = serving(keys={"user"}, admin_keys={"admin"})
    with client as c:
        for method, path in (("post", "/translator/clone_model/0"),
                             ("get", "/translator/unload_model/0"),
                             ("get", "/translator/to_cpu/0")):
            ask, held = getattr(c, method), dict(registry.models)
            state = registry.get(0).state
            body = {"json": {"opt": {"beam_size": 2}}} if method == "post" else {}
            assert ask(path, **body).status_code == 400, path  # no key
            assert ask(path + "?api_key=user", **body).status_code == 403, path
            assert ask(path, headers={"x-api-key": "nope"}, **body).status_code == 403, path
            assert registry.models == held and registry.get(0).state == state, path
            assert ask(path, headers={"x-api-key": "admin"}, **body).status_code == 200, path
        assert c.get("/translator/models").status_code == 200  # reading costs nothing
    registry, client = serving(keys={"user"})  # no admin list: the API keys
    with client as c:
        assert c.post("/translator/clone_model/0", json={}).status_code == 400
        assert c.post("/translator/clone_model/0?api_key=user", json={}).status_code == 200


def test_clones_are_bounded_and_an_unloaded_clone_frees_its_place():
    registry, client = serving(max_models=2)
    with client as c:
        first = c.post("/translator/clone_model/0", json={"opt": {"beam_size": 2}})
        assert first.status_code == 200 and first.json()["model_id"] == 1
        refused = c.post("/translator/clone_model/0", json={"opt": {"beam_size": 3}})
        assert refused.status_code == 400 and "-max_models 2" in refused.json()["error"]
        assert len(registry.models) == 2
        assert c.get("/translator/unload_model/1").status_code == 200
        assert [m["model_id"] for m in c.get("/translator/models").json()] == [0]
        again = c.post("/translator/clone_model/0", json={"opt": {"beam_size": 3}})
        assert again.status_code == 200 and again.json()["model_id"] == 2  # never reused
        assert c.get("/translator/unload_model/0").status_code == 200  # configured: stays
        assert [m["model_id"] for m in c.get("/translator/models").json()] == [0, 2]


@pytest.mark.parametrize("opt, limit", [
    ({"beam_size": 100000}, "-max_beam_size"), ({"n_best": 100}, "-max_beam_size"),
    ({"max_length": 10 ** 7}, "-max_target_length"), ({"batch_size": 10 ** 6}, "-max_batch_size"),
    ({"beam_size": 60, "max_length_ratio": 0}, "-lane_memory"),
])
def test_a_clones_options_are_bounded_before_any_lane_starts(opt, limit):
    registry, client = serving(lane_memory=64)
    with client as c:
        refused = c.post("/translator/clone_model/0", json={"opt": opt})
        assert refused.status_code == 400 and limit in refused.json()["error"], refused.json()
        assert list(registry.models) == [0]


def test_a_conf_models_options_are_bounded_at_start_up():
    spec = ModelSpec(0, MODEL, {"beam_size": 500}, "en", "de")
    with pytest.raises(LimitError, match="beam_size 500 is over the server's limit of 64"):
        Registry([spec], Scheduling(lanes=1))


def test_a_request_needing_more_search_memory_than_a_lane_may_use_is_refused_first():
    registry, client = serving(lane_memory=64)
    with client as c:
        refused = onmt(c, [" ".join(DEMO) * 3] * 32)  # each src one unit: long sources
        assert refused.status_code == 400 and "-lane_memory" in refused.json()["error"]
        assert "onmt_lite_batch_size_count" not in c.get("/metrics").text  # no batch started
        assert onmt(c, DEMO[:2]).status_code == 200


def onmt(client, texts):
    """OpenNMT-py's API, which translates each ``src`` as one unit (LibreTranslate's cuts texts
    into sentences): the tests of lanes and limits send long sources through it."""
    return client.post("/translator/translate", json=[{"src": t, "id": 0} for t in texts])


# -- lanes that die, sentences that kill them, requests abandoned --------------------------------
@pytest.fixture(scope="module")
def translator():
    from onmt_lite.translate.build import build_translator
    return build_translator({"model": MODEL, "max_length_ratio": 0})


def lane_holding(batcher, tokens):
    """The lane decoding a sentence of ``tokens`` (None: none does)."""
    with batcher.changed:
        for lane in batcher.lanes:
            if any(job.tokens == tokens and not job.over
                   for batch, _ in lane.active.values() for job in batch):
                return lane
    return None


def test_a_lane_that_dies_loses_no_request_and_is_replaced(translator, caplog):
    """16 clients, one-sentence requests, a lane SIGKILLed mid-run: every answer is the
    translator's own, the lane is replaced, the log and /metrics say so."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor
    lines = [f"{line} {extra}".strip() for extra in ("", "Then it rains.", "Two dogs run.")
             for line in DEMO] * 4
    expected = {line: t.output_lines()[0] for line, t in zip(lines, translator.translate(lines))}
    registry, client = serving(lanes=2, opt={"max_length_ratio": 0})
    with client as c:
        batcher = registry.get(0).batcher
        first = batcher.lanes[0]
        threading.Timer(0.8, first.process.kill).start()
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda line: onmt(c, [line]), lines))
        assert [a.status_code for a in answers] == [200] * len(lines)
        assert [a.json()[0][0]["tgt"] for a in answers] == [expected[x] for x in lines]
        deadline = time.monotonic() + 60
        while len(batcher.lanes) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(batcher.lanes) == 2 and first not in batcher.lanes
        assert first.process.exitcode == -9  # reaped, not a zombie
        assert 'onmt_lite_lane_restarts_total{model="0"} 1.0' in c.get("/metrics").text
        assert onmt(c, [DEMO[0]]).json()[0][0]["tgt"] == translator.translate([DEMO[0]])[0] \
            .output_lines()[0]
    assert "a lane process ended (killed by SIGKILL)" in caplog.text


def test_a_sentence_that_kills_every_lane_it_reaches_fails_alone(translator):
    """A sentence whose lane dies each time it decodes (here: killed from outside whenever a
    lane holds it) fails after two lanes, decoded alone the second time; the sentences that
    shared its batch get their translations, and the model serves on."""
    import threading
    import time

    from onmt_lite.serve.batcher import Batcher, SentenceFailed, Settings
    options = {"model": MODEL, "max_length_ratio": 0, "keep_attention": False}
    batcher = Batcher(options, Scheduling(lanes=2))
    poison = translator.source_tokens(" ".join(DEMO * 3), 1)
    others = [translator.source_tokens(line, 1) for line in DEMO[:5]]
    kills, done = [], threading.Event()

    def killer():
        while not done.is_set():
            lane = lane_holding(batcher, poison)
            if lane is not None and lane.process.is_alive():
                kills.append(lane.process.pid)
                lane.process.kill()
                lane.process.join()
            time.sleep(0.002)
    thread = threading.Thread(target=killer)
    thread.start()
    try:
        futures = batcher.submit([poison] + others, Settings(1))
        with pytest.raises(SentenceFailed, match="ended 2 lane processes.*alone"):
            futures[0].result(timeout=120)
        assert [f.result(timeout=120)[0][0] for f in futures[1:]] == \
            [t.output_lines()[0] for t in translator.translate(DEMO[:5])]
        # distinct lanes: the pool's collector may reap a killed lane while this thread joins
        # it, and multiprocessing then reports it alive a moment longer
        assert len(set(kills)) == 2
        done.set()
        again = batcher.submit([others[0]], Settings(1))
        assert again[0].result(timeout=120)[0][0] == \
            translator.translate(DEMO[:1])[0].output_lines()[0]
    finally:
        done.set()
        thread.join()
        batcher.stop()


def test_abandoned_sentences_leave_the_queue_and_their_lanes_search(translator):
    """One lane decodes a long batch; its client goes: the lane stops that search at once (its
    batch ends long before it would have), and sentences still queued never decode."""
    import time

    from onmt_lite.serve.batcher import Batcher, Settings
    options = {"model": MODEL, "max_length_ratio": 0, "keep_attention": False}
    batcher = Batcher(options, Scheduling(lanes=1, max_batches=1, batch_size=16))
    try:
        long = translator.source_tokens(" ".join(DEMO * 2), 1)
        alone = batcher.submit([long], Settings(1))[0].result(timeout=120)  # warm
        start = time.monotonic()
        for future in batcher.submit([long] * 16, Settings(1)):
            future.result(timeout=120)
        whole = time.monotonic() - start  # the batch decoded to its end
        decoding = batcher.submit([long] * 16, Settings(1))
        queued = batcher.submit([long] * 16, Settings(1))  # waits: one batch a lane
        time.sleep(0.2)
        lane = batcher.lanes[0]
        assert len(lane.active) == 1 and batcher.queued() == 16
        start = time.monotonic()
        batcher.abandon(decoding + queued)
        assert batcher.queued() == 0 and all(f.cancelled() or f.exception() for f in
                                             decoding + queued)
        while lane.active and time.monotonic() - start < 60:
            time.sleep(0.005)
        dropped = time.monotonic() - start
        assert not lane.active and batcher.running == 0
        assert dropped < whole / 4, (dropped, whole)  # at the lane's next step, not at its end
        assert batcher.submit([long], Settings(1))[0].result(timeout=120)[0] == alone[0]
    finally:
        batcher.stop()


def test_a_request_whose_sentence_kills_its_lanes_gets_a_500_naming_it(translator):
    import threading
    import time
    registry, client = serving(lanes=1)
    poison = " ".join(DEMO * 3)
    tokens = translator.source_tokens(poison, 1)
    done = threading.Event()

    def killer():
        while not done.is_set():
            lane = lane_holding(registry.get(0).batcher, tokens)
            if lane is not None and lane.process.is_alive():
                lane.process.kill()
                lane.process.join()
            time.sleep(0.002)
    with client as c:
        thread = threading.Thread(target=killer)
        thread.start()
        try:
            failed = onmt(c, [poison])  # one unit: LibreTranslate's API would cut sentences
        finally:
            done.set()
            thread.join()
        assert failed.status_code == 500, failed.text
        assert "ended 2 lane processes" in failed.json()["error"]
        assert onmt(c, [DEMO[0]]).status_code == 200
