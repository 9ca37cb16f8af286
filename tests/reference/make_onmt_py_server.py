"""Makes tests/reference/onmt_py_server.json: OpenNMT-py 3.5.1's own server (``onmt_server``)
answering POST /translator/translate, for test_serve_parity.py. Two models from one conf.json:
the Transformer fixture (tokenized text, n_best 2) and the sentencepiece fixture with a
``tokenizer`` entry (raw text). Each request sends INPUTS (outer spaces, an empty line, a line of
spaces among them) and the first LINES lines of the test set, one request each. OpenNMT-py is not
a dependency: run this with the peers virtualenv (../shared/peers/setup-peers.sh), from the
repository root:

    ~/onmt-peers/bin/python tests/reference/make_onmt_py_server.py
"""
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.path.join(HERE, "..", "..", "..", "shared")
FIXTURES = os.path.join(SHARED, "fixtures")
DATA = os.path.join(SHARED, "data", "multi30k")
LINES = 20
INPUTS = ["  a man is riding a bike . ", "", "   ", "two dogs play in the snow ."]
RAW_INPUTS = [" A man is riding a bike. ", "", "Two dogs play in the snow."]


def conf(work: str) -> dict:
    """The conf.json (models_root is the fixtures folder, as paths under it)."""
    return {"models_root": os.path.abspath(FIXTURES), "models": [
        {"id": 0, "model": "onmt-py/transformer.pt", "load": True,
         "opt": {"beam_size": 5, "n_best": 2}},
        {"id": 1, "model": "onmt-py-spm/model.pt", "load": True, "opt": {"beam_size": 4},
         "tokenizer": {"type": "sentencepiece", "model": "onmt-py-spm/spm.model"}}]}


def post(port: int, body) -> list:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/translator/translate",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())


def main() -> None:
    with open(os.path.join(DATA, "test_2016_flickr.lc.tok.en"), encoding="utf-8") as f:
        tokenized = [next(f).strip() for _ in range(LINES)]
    with open(os.path.join(DATA, "test_2016_flickr.en"), encoding="utf-8") as f:
        raw = [next(f).strip() for _ in range(LINES)]
    requests = [(0, INPUTS), (0, tokenized), (1, RAW_INPUTS), (1, raw)]
    with tempfile.TemporaryDirectory() as work:
        path = os.path.join(work, "conf.json")
        with open(path, "w") as f:
            json.dump(conf(work), f)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = subprocess.Popen(
            [os.path.join(os.path.dirname(sys.executable), "onmt_server"), "--ip", "127.0.0.1",
             "--port", str(port), "--model_config", path], cwd=work,
            env=dict(os.environ, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1"),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(300):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/translator/health")
                    break
                except OSError:
                    time.sleep(0.5)
            cases = [{"id": model_id, "inputs": inputs,
                      "response": post(port, [{"src": s, "id": model_id} for s in inputs])}
                     for model_id, inputs in requests]
        finally:
            server.terminate()
            server.wait()
    import onmt
    out = {"made_by": "tests/reference/make_onmt_py_server.py", "opennmt-py": onmt.__version__,
           "conf_models": conf("")["models"], "cases": cases}
    with open(os.path.join(HERE, "onmt_py_server.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
