"""The translation server: both APIs, their answers equal to the translator's, every bad request
a 4xx with a JSON error, limits, keys, conf.json, metrics; as a process: SIGTERM drain and 1,000
sentences from 32 concurrent clients, each answer checked against its own line."""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

fastapi = pytest.importorskip("fastapi", reason="the server needs the serve extra (fastapi)")
httpx = pytest.importorskip("httpx", reason="the server tests need httpx")
from fastapi.testclient import TestClient  # noqa: E402

from onmt_lite.serve.app import Limits, create_app  # noqa: E402
from onmt_lite.serve.batcher import Batcher, Scheduling, Settings  # noqa: E402
from onmt_lite.serve.config import ConfError, ModelSpec, read_conf  # noqa: E402
from onmt_lite.serve.models import Registry  # noqa: E402
from onmt_lite.translate.build import build_translator  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "data", "multi30k_en_de_raw.pt")
DEMO = [line for line in open(os.path.join(ROOT, "data", "demo.en"), encoding="utf-8")
        .read().splitlines() if line.strip()]
TEST_SET = os.path.join(ROOT, "..", "shared", "data", "multi30k", "test_2016_flickr.en")


def app_for(specs, limits=Limits(), keys=None, lanes=2, **scheduling):
    return TestClient(create_app(Registry(specs, Scheduling(lanes=lanes, **scheduling)), limits,
                                 keys))


def onmt_texts(http, texts):
    """Each text's translation through OpenNMT-py's API, which translates every ``src`` as one
    unit (LibreTranslate's cuts texts into sentences and restores their case): the tests of
    batching and lanes compare with the translator's own lines."""
    response = http.post("/translator/translate", json=[{"src": t, "id": 0} for t in texts])
    assert response.status_code == 200, response.text
    return [entry["tgt"] for entry in response.json()[0]]


@pytest.fixture(scope="module")
def client():
    spec = ModelSpec(0, MODEL, {"n_best": 2}, "en", "de", user_opt={"n_best": 2})
    with app_for([spec]) as c:
        yield c


@pytest.fixture(scope="module")
def reference():
    """The translator's own n-best (2) for the demo lines, as translate.py writes them."""
    translator = build_translator({"model": MODEL, "n_best": 2})
    return {line: (t.output_lines(), t.scores) for line, t in zip(DEMO, translator.translate(DEMO))}


# -- LibreTranslate's API ---------------------------------------------------------------------
def test_libretranslate_translates_a_text_a_list_and_a_form(client, reference):
    line = DEMO[0]
    body = client.post("/translate", json={"q": line, "source": "en", "target": "de"}).json()
    assert body == {"translatedText": reference[line][0][0]}
    body = client.post("/translate", json={"q": DEMO[:3], "source": "EN", "target": "de",
                                           "alternatives": 1}).json()
    assert body["translatedText"] == [reference[x][0][0] for x in DEMO[:3]]
    assert body["alternatives"] == [[reference[x][0][1]] for x in DEMO[:3]]
    form = client.post("/translate", data={"q": line, "source": "en", "target": "de"})
    assert form.json() == {"translatedText": reference[line][0][0]}
    multipart = client.post("/translate", files={"q": (None, line), "source": (None, "en"),
                                                 "target": (None, "de")})
    assert multipart.json() == {"translatedText": reference[line][0][0]}


def test_a_text_of_several_lines_keeps_its_lines(client, reference):
    text = f"{DEMO[0]}\r\n\n{DEMO[1]}"
    body = client.post("/translate", data={"q": text, "source": "en", "target": "de"}).json()
    assert body["translatedText"] == f"{reference[DEMO[0]][0][0]}\n\n{reference[DEMO[1]][0][0]}"


def test_languages_detect_and_frontend_settings(client):
    assert client.get("/languages").json() == [
        {"code": "en", "name": "English", "targets": ["de", "en"]},
        {"code": "de", "name": "German", "targets": ["de"]}]
    assert client.post("/detect", json={"q": "Hello"}).json() == [{"confidence": 90.0,
                                                                   "language": "en"}]
    auto = client.post("/translate", json={"q": DEMO[0], "source": "auto", "target": "de"})
    assert auto.json()["detectedLanguage"]["language"] == "en"
    settings = client.get("/frontend/settings").json()
    assert settings["language"]["source"]["code"] == "auto" and settings["apiKeys"] is False


# -- OpenNMT-py's API -------------------------------------------------------------------------
def test_onmt_py_translate_answers_a_list_per_n_best_rank(client, reference):
    inputs = [{"src": f"  {DEMO[0]} ", "id": 0}, {"src": "", "id": 0}, {"src": DEMO[1], "id": 0}]
    out = client.post("/translator/translate", json=inputs).json()
    assert len(out) == 2 and all(len(rank) == 3 for rank in out)
    for rank in range(2):
        first, empty, second = out[rank]
        assert first == {"src": f"  {DEMO[0]} ", "tgt": f"  {reference[DEMO[0]][0][rank]} ",
                         "n_best": 2,  # a lane's one thread rounds unlike this process's
                         "pred_score": pytest.approx(reference[DEMO[0]][1][rank], abs=1e-5)}
        assert (empty["tgt"], empty["pred_score"]) == ("", 0.0)
        assert second["tgt"] == reference[DEMO[1]][0][rank]


def test_onmt_py_models_health_unload_and_clone(client):
    assert client.get("/translator/health").json() == {"status": "ok"}
    models = client.get("/translator/models").json()
    assert models[0]["model_id"] == 0 and models[0]["loaded"] and models[0]["opt"] == {"n_best": 2}
    assert client.get("/translator/unload_model/0").json() == {"model_id": 0, "status": "ok"}
    assert client.get("/translator/models").json()[0]["loaded"] is False
    again = client.post("/translator/translate", json=[{"src": DEMO[0], "id": 0}])
    assert again.status_code == 200  # loaded again at its first request
    clone = client.post("/translator/clone_model/0",
                        json={"opt": {"beam_size": 3, "n_best": 3}, "timeout": -1}).json()
    assert clone["status"] == "ok" and clone["model_id"] == 1
    out = client.post("/translator/translate", json=[{"src": DEMO[0], "id": 1}]).json()
    assert len(out) == 3
    for opt in ({"model": "/etc/passwd"}, {"src": "x.txt"}, {"beam_size": "five"}, {"nope": 1},
                {"compile": True, "compile_cache": "/tmp/elsewhere"}):
        refused = client.post("/translator/clone_model/0", json={"opt": opt})
        assert refused.status_code == 400 and refused.json()["status"] == "error", opt


# -- bad requests -----------------------------------------------------------------------------
BAD = [
    ("/translate", b"{", "application/json", 400, "not valid JSON"),
    ("/translate", b"[1]", "application/json", 400, "must be an object"),
    ("/translate", b'{"source": "en", "target": "de"}', "application/json", 400, "missing q"),
    ("/translate", b'{"q": "", "source": "en", "target": "de"}', "application/json", 400,
     "missing q"),
    ("/translate", b'{"q": 3, "source": "en", "target": "de"}', "application/json", 400,
     "q must be"),
    ("/translate", b'{"q": ["a", 2], "source": "en", "target": "de"}', "application/json", 400,
     "q must be"),
    ("/translate", b'{"q": "a", "target": "de"}', "application/json", 400, "missing source"),
    ("/translate", b'{"q": "a", "source": "xx", "target": "de"}', "application/json", 400,
     "xx is not supported"),
    ("/translate", b'{"q": "a", "source": "en", "target": "fr"}', "application/json", 400,
     "fr is not supported from en"),
    ("/translate", b'{"q": "a", "source": "en", "target": "de", "format": "xml"}',
     "application/json", 400, "format"),
    ("/translate", b'{"q": "a", "source": "en", "target": "de", "alternatives": "x"}',
     "application/json", 400, "alternatives"),
    ("/translate", b'{"q": "a", "source": "en", "target": "de", "alternatives": 9}',
     "application/json", 400, "at most 4"),
    ("/translate", b"q=a&source=en", "application/x-www-form-urlencoded", 400, "missing target"),
    ("/translate", b"\xff\xfe", "application/json", 400, "not valid JSON"),
    ("/translator/translate", b"{}", "application/json", 400, "non-empty list"),
    ("/translator/translate", b"[]", "application/json", 400, "non-empty list"),
    ("/translator/translate", b'[{"src": 1}]', "application/json", 400, "input 0"),
    ("/translator/translate", b'[{"src": "a", "id": "zero"}]', "application/json", 400,
     "integer"),
    ("/translator/translate", b'[{"src": "a", "id": 7}]', "application/json", 404,
     "No such model '7'"),
    ("/inspect", b'{"q": " ", "source": "en", "target": "de"}', "application/json", 400,
     "non-empty"),
    ("/detect", b"{}", "application/json", 400, "missing q"),
]


@pytest.mark.parametrize("path, body, content_type, status, message", BAD)
def test_a_bad_request_gets_a_4xx_with_a_json_error(client, path, body, content_type, status,
                                                   message):
    response = client.post(path, content=body, headers={"content-type": content_type})
    assert response.status_code == status
    assert message in response.json()["error"]
    assert client.get("/health").status_code == 200  # and the server serves on


def test_unknown_model_routes_and_wrong_methods_are_4xx(client):
    assert client.get("/translator/unload_model/12").status_code == 404
    assert client.get("/translator/unload_model/x").status_code == 400
    assert client.get("/translate").status_code == 405
    assert client.get("/nowhere").status_code == 404


def test_limits_of_size_count_and_length():
    spec = ModelSpec(0, MODEL, {}, "en", "de")
    with app_for([spec], Limits(max_request_bytes=2000, max_sentences=3, max_chars=50)) as c:
        big = c.post("/translate", json={"q": "a" * 3000, "source": "en", "target": "de"})
        assert big.status_code == 413 and "2000 bytes" in big.json()["error"]

        def chunks():  # no content-length: the body streams in, and is counted
            for _ in range(10):
                yield b" " * 500
        streamed = c.post("/translate", content=chunks(),
                          headers={"content-type": "application/json"})
        assert streamed.status_code == 413
        many = c.post("/translate", json={"q": ["a"] * 4, "source": "en", "target": "de"})
        assert many.status_code == 400 and "-max_sentences" in many.json()["error"]
        long = c.post("/translate", json={"q": "a " * 30, "source": "en", "target": "de"})
        assert long.status_code == 400 and "-max_chars" in long.json()["error"]
        assert c.post("/translate", json={"q": "A dog.", "source": "en",
                                          "target": "de"}).status_code == 200


def test_a_full_queue_answers_503_with_retry_after_and_a_slow_one_times_out():
    spec = ModelSpec(0, MODEL, {}, "en", "de")
    with app_for([spec], Limits(), lanes=1, max_queue=2) as c:
        full = c.post("/translate", json={"q": DEMO[:3], "source": "en", "target": "de"})
        assert full.status_code == 503 and int(full.headers["retry-after"]) >= 1
        assert "busy" in full.json()["error"]
    with app_for([spec], Limits(timeout=0.001)) as c:
        slow = c.post("/translate", json={"q": DEMO * 5, "source": "en", "target": "de"})
        assert slow.status_code == 503 and "-timeout" in slow.json()["error"]
        assert c.get("/ready").status_code == 200


def test_api_keys_are_checked_on_both_apis():
    spec = ModelSpec(0, MODEL, {}, "en", "de")
    with app_for([spec], keys={"k1"}) as c:
        ask = {"q": "A dog.", "source": "en", "target": "de"}
        assert c.post("/translate", json=ask).status_code == 400
        assert c.post("/translate", json={**ask, "api_key": "k2"}).status_code == 403
        assert c.post("/translate", json={**ask, "api_key": "k1"}).status_code == 200
        assert c.post("/translate", data={**ask, "api_key": "k1"}).status_code == 200
        onmt = [{"src": "A dog.", "id": 0}]
        assert c.post("/translator/translate", json=onmt).status_code == 400
        assert c.post("/translator/translate?api_key=k1", json=onmt).status_code == 200
        assert c.post("/translator/translate", json=onmt,
                      headers={"x-api-key": "k1"}).status_code == 200


# -- conf.json --------------------------------------------------------------------------------
def write_conf(tmp_path, models, root=None):
    path = tmp_path / "conf.json"
    path.write_text(json.dumps({"models_root": str(root or tmp_path), "models": models}))
    return str(path)


@pytest.mark.parametrize("entry, message", [
    ({"model": "m.pt", "preprocess": ["os.system"]}, "'preprocess' names Python code"),
    ({"model": "m.pt", "postprocess": ["x.y"]}, "'postprocess' names Python code"),
    ({"model": "m.pt", "custom_opt": {}}, "'custom_opt' names Python code"),
    ({"model": "m.pt", "ct2_model": "x"}, "'ct2_model' is not supported"),
    ({"model": "m.pt", "colour": 1}, "unknown field(s) colour"),
    ({"model": "missing.pt"}, "no such file"),
    ({"model": "m.pt", "opt": {"output": "/tmp/x"}}, "opt 'output' cannot be set"),
    ({"model": "m.pt", "opt": {"compile_cache": "x"}}, "'compile_cache' names a folder of "
                                                       "compiled code"),
    ({"model": "m.pt", "timeout": "soon"}, "'timeout' must be a number"),
    ({"model": "m.pt", "tokenizer": {"type": "moses"}}, "tokenizer: type must be"),
])
def test_conf_json_refuses_code_and_what_it_cannot_serve_in_one_line(tmp_path, entry, message):
    (tmp_path / "m.pt").write_bytes(b"")
    with pytest.raises(ConfError) as err:
        read_conf(write_conf(tmp_path, [entry]))
    assert message in str(err.value) and "conf.json: models[0]" in str(err.value)


def test_conf_json_as_opennmt_py_writes_it_and_a_broken_model_leaves_the_others(tmp_path,
                                                                              reference):
    (tmp_path / "broken.pt").write_bytes(b"not a checkpoint")
    os.symlink(MODEL, tmp_path / "good.pt")
    conf = write_conf(tmp_path, [
        {"id": 100, "model": "good.pt", "timeout": 600, "on_timeout": "unload", "load": True,
         "opt": {"beam_size": 3, "batch_size": 8}, "src_lang": "en", "tgt_lang": "de"},
        {"id": 5, "model": "broken.pt", "load": True, "src_lang": "en", "tgt_lang": "fr"},
        {"model": "good.pt", "tokenizer": {"type": "sentencepiece",
                                           "model": os.path.join(ROOT, "data",
                                                                 "multi30k_en_de.spm")}}])
    specs = read_conf(conf)
    assert [s.id for s in specs] == [100, 5, 101] and specs[0].opt == {"beam_size": 3,
                                                                      "batch_size": 8}
    assert specs[2].opt["transforms"] == ["sentencepiece"]
    with app_for(specs) as c:
        models = {m["model_id"]: m for m in c.get("/translator/models").json()}
        assert models[100]["loaded"] and not models[5]["loaded"]
        assert "broken.pt" in models[5]["error"]
        ok = c.post("/translator/translate", json=[{"src": DEMO[0], "id": 100}])
        assert ok.status_code == 200
        broken = c.post("/translate", json={"q": "A dog.", "source": "en", "target": "fr"})
        assert broken.status_code == 503 and "broken.pt" in broken.json()["error"]
        tokenized = c.post("/translator/translate", json=[{"src": DEMO[0], "id": 101}]).json()
        assert tokenized[0][0]["tgt"] == reference[DEMO[0]][0][0]  # the checkpoint's own .spm


def test_metrics_count_requests_sentences_batches_and_the_queue(client):
    client.post("/translate", json={"q": DEMO[:2], "source": "en", "target": "de"})
    text = client.get("/metrics").text
    for name in ("onmt_lite_requests_total{endpoint=\"/translate\",status=\"200\"}",
                 "onmt_lite_sentences_total{model=\"0\"}", "onmt_lite_batch_size_bucket",
                 "onmt_lite_queue_length", "onmt_lite_request_duration_seconds_bucket",
                 "onmt_lite_queue_wait_seconds_bucket"):
        assert name in text


def test_inspect_gives_the_n_best_and_each_lines_attention(client, reference):
    body = client.post("/inspect", json={"q": DEMO[0], "source": "en", "target": "de",
                                         "n_best": 2}).json()
    assert [x["text"] for x in body["nbest"]] == reference[DEMO[0]][0]
    sentence = body["sentences"][0]
    rows, width = len(sentence["target_tokens"]), len(sentence["source_tokens"])
    assert len(sentence["attention"]) == rows and all(len(r) == width
                                                      for r in sentence["attention"])
    assert all(abs(sum(r) - 1) < 1e-3 for r in sentence["attention"])


# -- the server as a process ------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``onmt_lite serve`` as a process, on ``model`` (en -> de) with ``options``; its log is
    read as it comes (a long run's log would fill a pipe nobody reads), and it starts under a
    soft limit of ``nofile`` open files when given."""

    def __init__(self, *options, model=MODEL, start_s=60, nofile=None, env=None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log, limit = [], None
        if nofile is not None:
            import resource
            hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
            limit = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))  # noqa: E731
        self.process = subprocess.Popen(
            [sys.executable, "-m", "onmt_lite", "serve", "-model", model, "-src_lang", "en",
             "-tgt_lang", "de", "-port", str(self.port), *options],
            cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
            preexec_fn=limit, env=env)
        threading.Thread(target=lambda: self.log.extend(self.process.stderr), daemon=True).start()
        deadline = time.monotonic() + start_s
        while time.monotonic() < deadline:
            assert self.process.poll() is None, "".join(self.log)
            try:
                if httpx.get(self.url + "/ready").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"the server did not become ready in {start_s} s")

    def stop(self):
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def test_sigterm_finishes_the_requests_in_flight_then_exits_0():
    server = Server()
    try:
        answer = {}

        def ask():
            answer["response"] = httpx.post(server.url + "/translate", timeout=120, json={
                "q": DEMO * 8, "source": "en", "target": "de"})
        asker = threading.Thread(target=ask)
        asker.start()
        time.sleep(0.3)  # the request is in flight
        server.process.send_signal(signal.SIGTERM)
        asker.join(120)
        assert server.process.wait(60) == 0
        response = answer["response"]
        assert response.status_code == 200 and len(response.json()["translatedText"]) == \
            len(DEMO) * 8
        with pytest.raises(httpx.HTTPError):  # and it no longer accepts
            httpx.get(server.url + "/health")
    finally:
        server.stop()


def test_a_libretranslate_client_library_works_unchanged():
    """libretranslatepy, a client written for LibreTranslate's server (form-encoded POSTs, a GET
    with a body), against this server."""
    lt = pytest.importorskip("libretranslatepy", reason="needs libretranslatepy (test extra)")
    server = Server()
    try:
        client = lt.LibreTranslateAPI(server.url + "/")
        translated = client.translate(DEMO[0], "en", "de")
        assert translated == httpx.post(server.url + "/translate", json={
            "q": DEMO[0], "source": "en", "target": "de"}).json()["translatedText"]
        assert client.languages() == [{"code": "en", "name": "English", "targets": ["de", "en"]},
                                      {"code": "de", "name": "German", "targets": ["de"]}]
        assert client.detect("Hello") == [{"confidence": 90.0, "language": "en"}]
        keyed = lt.LibreTranslateAPI(server.url, api_key="unused")  # no keys configured
        assert keyed.translate(DEMO[1], "en", "de")
    finally:
        server.stop()


def test_openapi_documents_both_apis(client):
    assert client.get("/docs").status_code == 200
    paths = client.get("/openapi.json").json()["paths"]
    for path in ("/translate", "/languages", "/detect", "/translator/translate",
                 "/translator/models", "/translator/clone_model/{model_id}", "/metrics"):
        assert path in paths


@pytest.mark.skipif(not os.path.exists(TEST_SET), reason="needs ../shared (Multi30k test set)")
def test_400_sentences_from_32_clients_each_get_their_own_translation():
    """Every answer is checked against translate.py's line for the same sentence; with
    -max_length_ratio 0 no rule depends on the other sentences of a batch."""
    lines = open(TEST_SET, encoding="utf-8").read().splitlines()[:400]
    translator = build_translator({"model": MODEL, "max_length_ratio": 0})
    expected = [t.output_lines()[0] for t in translator.translate(lines, batch_size=30)]
    server = Server("-max_length_ratio", "0")
    try:
        with httpx.Client(base_url=server.url, timeout=120,
                          limits=httpx.Limits(max_connections=32)) as http:
            def one(i):
                response = http.post("/translator/translate", json=[{"src": lines[i], "id": 0}])
                return response.status_code, response.json()[0][0]["tgt"]
            with ThreadPoolExecutor(32) as pool:
                answers = list(pool.map(one, range(len(lines))))
            batches = [line for line in http.get("/metrics").text.splitlines()
                       if line.startswith("onmt_lite_batch_size_count")]
        assert [status for status, _ in answers] == [200] * len(lines)
        wrong = [(i, got, want) for i, ((_, got), want) in enumerate(zip(answers, expected))
                 if got != want]
        assert wrong == []
        assert float(batches[0].split()[-1]) < len(lines) / 2  # sentences shared batches
    finally:
        server.stop()


def test_a_short_request_does_not_wait_for_a_long_batch_that_started_before_it(reference):
    """One lane: a batch of 24 long sentences is decoding when a short sentence arrives; the
    short one starts its own batch at the next step and ends first, with the translation it
    has alone."""
    options = {"model": MODEL, "max_length_ratio": 0, "n_best": 2, "keep_attention": False}
    translator = build_translator(options)
    batcher = Batcher(options, Scheduling(lanes=1))
    try:
        long_line = " ".join(DEMO)  # several sentences in one line: a long translation
        long = batcher.submit([translator.source_tokens(long_line, 1)] * 24, Settings(2))
        time.sleep(0.2)
        assert not all(f.done() for f in long)  # still decoding (the first may have ended)
        short = batcher.submit([translator.source_tokens(DEMO[0], 1)], Settings(2))
        texts = short[0].result(timeout=60)[0]
        assert sum(f.done() for f in long) < len(long) / 2
        assert texts == reference[DEMO[0]][0]
        alone = translator.translate([long_line])[0].output_lines()
        assert all(f.result(timeout=120)[0] == alone for f in long)
    finally:
        batcher.stop()


def test_a_request_whose_only_lane_dies_is_answered_by_its_replacement():
    spec = ModelSpec(0, MODEL, {}, "en", "de")
    registry = Registry([spec], Scheduling(lanes=1))
    with TestClient(create_app(registry)) as c:
        batcher = registry.get(0).batcher
        lane = batcher.lanes[0]

        def kill_once_decoding():
            while not lane.active:
                time.sleep(0.001)
            lane.process.kill()
        threading.Thread(target=kill_once_decoding).start()
        texts = [" ".join(DEMO)] * 6
        translator = build_translator({"model": MODEL})
        assert onmt_texts(c, texts) == [t.output_lines()[0] for t in translator.translate(texts)]
        assert lane.process.exitcode == -signal.SIGKILL and batcher.lanes != [lane]


def test_a_batch_takes_sentences_of_a_similar_length_to_the_oldest():
    """A short sentence never waits in a batch for sentences more than twice as long (nor a
    long one for short ones): those wait for the next batch."""
    from collections import deque
    from concurrent.futures import Future
    from types import SimpleNamespace

    from onmt_lite.serve.batcher import Job
    jobs = [Job(["x"] * n, Settings(1), Future(), 0.0) for n in (5, 12, 3, 9, 30, 6)]
    queue = SimpleNamespace(pending=deque(jobs), batch_size=32, running=0)
    assert [len(job.tokens) for job in Batcher._batch(queue)] == [5, 3, 9, 6]
    assert [len(job.tokens) for job in queue.pending] == [12, 30]
    assert [len(job.tokens) for job in Batcher._batch(queue)] == [12]


def test_under_load_only_a_sentence_short_beside_a_lanes_own_skips_the_batch_wait():
    """With no lane free, a busy lane takes sentences once they have waited -batch_wait, or at
    once where the oldest is at most half as long as every sentence the lane decodes (it
    steps alone there)."""
    from collections import deque
    from concurrent.futures import Future
    from types import SimpleNamespace

    from onmt_lite.serve.batcher import Job

    def job(length, queued=100.0):
        return Job(["x"] * length, Settings(1), Future(), queued)
    busy = SimpleNamespace(active={0: ([job(12), job(20)], 0.0)})
    ended = job(4)
    ended.future.set_result(None)  # answered: no longer decoding
    other = SimpleNamespace(active={1: ([job(9), ended], 0.0)})
    batcher = SimpleNamespace(pending=deque(), stopping=False, batch_size=32, batch_wait=0.01,
                              max_batches=4, lanes=[busy, other])
    batcher._short_beside = lambda lane: Batcher._short_beside(batcher, lane)
    for length, lane, wait in [(6, busy, 0), (7, busy, 0.01), (4, other, 0), (5, other, 0.01)]:
        batcher.pending = deque([job(length)])
        assert Batcher._admissible(batcher, lane, 100.0) == pytest.approx(wait), length
    batcher.pending = deque([job(7, queued=99.98)])  # waited long enough
    assert Batcher._admissible(batcher, busy, 100.0) == 0


def test_report_align_gives_each_hypothesis_the_attentions_alignment():
    spec = ModelSpec(0, MODEL, {"report_align": True, "n_best": 2}, "en", "de",
                     user_opt={"report_align": True, "n_best": 2})
    with app_for([spec], lanes=1) as c:
        out = c.post("/translator/translate", json=[{"src": DEMO[0], "id": 0},
                                                    {"src": "", "id": 0}]).json()
        inspected = c.post("/inspect", json={"q": DEMO[0], "source": "en", "target": "de",
                                             "n_best": 2}).json()["sentences"][0]
    rows = [r for r, token in zip(inspected["attention"], inspected["target_tokens"])
            if token != "</s>"]
    best = " ".join(f"{max(range(len(r)), key=r.__getitem__)}-{t}" for t, r in enumerate(rows))
    assert out[0][0]["align"] == best
    assert out[0][0]["align_score"] == [max(r) for r in rows]
    for rank in out:
        pairs = rank[0]["align"].split()
        assert [int(p.split("-")[1]) for p in pairs] == list(range(len(pairs)))
        assert all(int(p.split("-")[0]) < len(inspected["source_tokens"]) for p in pairs)
        assert (rank[1]["align"], rank[1]["align_score"]) == ("", [])


def test_serve_takes_translate_options_given_even_at_their_default(tmp_path):
    """-beam_size 5 is translate.py's default, yet given: it stays the model's option (a Marian
    model's generation settings apply only to options not given)."""
    from onmt_lite.cli.serve import _specs, build_parser
    from onmt_lite.errors import OptionError
    args, rest = build_parser().parse_known_args(["-model", MODEL, "-beam_size", "5",
                                                  "-n_best", "2", "-port", "5001"])
    (spec,) = _specs(args, rest)
    assert spec.opt == {"beam_size": 5, "n_best": 2} and spec.src_lang is None
    args, rest = build_parser().parse_known_args(["-model", MODEL, "-compile",
                                                  "-compile_cache", str(tmp_path)])
    (spec,) = _specs(args, rest)  # the command line, not a conf or a client, names the folder
    assert spec.opt == {"compile": True, "compile_cache": str(tmp_path)}
    args, rest = build_parser().parse_known_args(["-model", MODEL, "-output", "x.txt"])
    with pytest.raises(OptionError, match="opt 'output' cannot be set"):
        _specs(args, rest)
    args, rest = build_parser().parse_known_args(["-model", MODEL, "-beam_size", "0"])
    with pytest.raises(SystemExit) as stop:
        _specs(args, rest)
    assert stop.value.code == 2


@pytest.mark.parametrize("given,joinable,batches", [(0, True, 4), (0, False, 1), (3, False, 3),
                                                    (2, True, 2)])
def test_a_lane_takes_one_batch_at_a_time_where_searches_do_not_join(given, joinable, batches):
    """-max_batches 0 (the default): four batches a lane where they join one search, one where
    each batch is a search of its own (CTranslate2's rule); a value given is kept."""
    from types import SimpleNamespace
    pool = SimpleNamespace(attach=lambda batcher, source: (0, []))
    batcher = Batcher({}, Scheduling(max_batches=given), pool=pool, joinable=joinable)
    assert batcher.max_batches == batches


def test_ctranslate2s_search_takes_no_sentences_between_steps():
    """CTranslate2's rule (an Argos package's default) does not join: a server's lanes take one
    batch of it at a time; OpenNMT-py's, the default, does."""
    model = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference", "ct2_tiny",
                         "prenorm_int8")
    assert not build_translator({"model": model, "search": "ctranslate2"}).joinable()
    assert build_translator({"model": model}).joinable()


def test_lanes_start_side_by_side_and_a_failed_start_stops_the_others(monkeypatch):
    """LanePool starts its lanes at once (each an interpreter and torch); where one fails to
    start, the others are stopped and its error raised."""
    from onmt_lite.serve import pool as pool_module
    from onmt_lite.serve.lanes import LaneError
    started, stopped, together = [], [], threading.Barrier(3, timeout=5)

    class FakeLane:
        def __init__(self):
            together.wait()  # three lanes starting at the same time, or BrokenBarrierError
            started.append(self)
            if len(started) == 2:
                raise LaneError("no room")

        def stop(self):
            stopped.append(self)
    monkeypatch.setattr(pool_module, "Lane", FakeLane)
    with pytest.raises(LaneError, match="no room"):
        pool_module.LanePool(3)
    assert len(started) == 3 and len(stopped) == 2 and started[1] not in stopped
