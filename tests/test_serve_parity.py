"""The server's OpenNMT-py API against OpenNMT-py 3.5.1's own server on the same conf.json and
checkpoints: every tgt and pred_score (reference made by tests/reference/make_onmt_py_server.py)."""
import json
import os

import pytest

pytest.importorskip("fastapi", reason="the server needs the serve extra (fastapi)")
from fastapi.testclient import TestClient  # noqa: E402

from onmt_lite.serve.app import create_app  # noqa: E402
from onmt_lite.serve.batcher import Scheduling  # noqa: E402
from onmt_lite.serve.config import read_conf  # noqa: E402
from onmt_lite.serve.models import Registry  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCE = os.path.join(HERE, "reference", "onmt_py_server.json")
FIXTURES = os.path.join(HERE, "..", "..", "shared", "fixtures")


@pytest.mark.skipif(not os.path.isdir(FIXTURES), reason="needs ../shared (the OpenNMT-py fixtures)")
def test_the_onmt_py_api_answers_as_opennmt_pys_server(tmp_path):
    with open(REFERENCE, encoding="utf-8") as f:
        reference = json.load(f)
    conf = tmp_path / "conf.json"
    conf.write_text(json.dumps({"models_root": os.path.abspath(FIXTURES),
                                "models": reference["conf_models"]}))
    with TestClient(create_app(Registry(read_conf(str(conf)), Scheduling(lanes=1)))) as client:
        for case in reference["cases"]:
            body = [{"src": s, "id": case["id"]} for s in case["inputs"]]
            ours = client.post("/translator/translate", json=body).json()
            theirs = case["response"]
            assert len(ours) == len(theirs)
            for our_rank, their_rank in zip(ours, theirs):
                assert [r["tgt"] for r in our_rank] == [r["tgt"] for r in their_rank]
                assert [r["src"] for r in our_rank] == [r["src"] for r in their_rank]
                assert [r["n_best"] for r in our_rank] == [r["n_best"] for r in their_rank]
                for mine, their in zip(our_rank, their_rank):
                    assert mine["pred_score"] == pytest.approx(their["pred_score"], abs=1e-4)
