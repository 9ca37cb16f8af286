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
        ask = {"q": [" ".join(DEMO) * 3] * 32, "source": "en", "target": "de"}
        refused = c.post("/translate", json=ask)
        assert refused.status_code == 400 and "-lane_memory" in refused.json()["error"]
        assert "onmt_lite_batch_size_count" not in c.get("/metrics").text  # no batch started
        assert c.post("/translate", json={**ask, "q": DEMO[:2]}).status_code == 200
