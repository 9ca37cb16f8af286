"""Agreement with LibreTranslate 1.9.6 on its own recorded answers
(tests/reference/libretranslate.json): ``onmt_lite serve -argos_packages`` serving the same
Argos package, every recorded request asked again through LibreTranslate's clients
(libretranslatepy where it has the call, plain JSON or multipart through httpx elsewhere), the
answers compared whole.

Used by tests/test_libre_client.py, and runnable for the table in docs/serving.md:

    .venv/bin/python tests/libre_agreement.py [--packages ~/argos-pkgs/fp32]
"""
import argparse
import base64
import io
import json
import os
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ElementTree
import zipfile
from collections import OrderedDict
from typing import Callable, Dict, Iterator, List, Tuple

import httpx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(ROOT, "tests", "reference", "libretranslate.json"), encoding="utf-8") as f:
    LT = json.load(f)
PACKAGES = os.environ.get("ONMT_LITE_ARGOS_PACKAGES",
                          os.path.expanduser(os.path.join("~", "argos-pkgs")))
FP32 = os.path.join(PACKAGES, "fp32")
W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"

# Beautiful Soup 4.9.3 (LibreTranslate's pin) writes "<br/>" after a "<br>" as an element
# opened there and closed at the end; current versions write two empty elements.
BS4_BR = "A man rides a bike.<br>A dog runs.<br/>Two women talk."


class Server:
    """``onmt_lite serve -argos_packages folder`` as a process; its log read as it comes."""

    def __init__(self, folder: str, *options: str, start_s: float = 180):
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.log: List[str] = []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "onmt_lite", "serve", "-argos_packages", folder,
             "-port", str(port), *options],
            cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        threading.Thread(target=lambda: self.log.extend(self.process.stderr), daemon=True).start()
        deadline = time.monotonic() + start_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("the server ended: " + "".join(self.log))
            try:
                if httpx.get(self.url + "/ready").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the server did not become ready in {start_s} s")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.process.wait()


def docx_runs(data: bytes) -> dict:
    """The text of every w:t of a .docx's body and header, in order, per part."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {name: [t.text or "" for t in ElementTree.fromstring(archive.read(name)).iter(
                    f"{{{W}}}t")]
                for name in ("word/document.xml", "word/header1.xml")}


def translate_file(url: str, name: str, content: bytes, source: str = "en") -> Tuple[str, bytes]:
    """/translate_file as LibreTranslate's web page sends it, then the download: the
    Content-Disposition and the file."""
    answer = httpx.post(url + "/translate_file", data={"source": source, "target": "de"},
                        files={"file": (name, content, "application/octet-stream")},
                        timeout=300)
    answer.raise_for_status()
    download = httpx.get(answer.json()["translatedFileUrl"], timeout=60)
    download.raise_for_status()
    return download.headers.get("content-disposition"), download.content


Case = Tuple[str, str, Callable[[str], object], object]  # kind, name, ask(url), theirs


def post(path: str, body: dict) -> Callable[[str], object]:
    def ask(url: str):
        return httpx.post(url + path, json=body, timeout=300).json()
    return ask


def client_call(method: str, *args) -> Callable[[str], object]:
    """A call of libretranslatepy's LibreTranslateAPI (form-encoded, as it sends them)."""
    def ask(url: str):
        from libretranslatepy import LibreTranslateAPI
        return getattr(LibreTranslateAPI(url + "/"), method)(*args)
    return ask


def text_cases() -> Iterator[Case]:
    for number, case in enumerate(LT["texts"]):
        theirs = case["answer"]["translatedText"]
        yield "texts (libretranslatepy)", f"texts[{number}]", \
            client_call("translate", case["q"], "en", "de"), theirs
    for number, case in enumerate(LT["html"]):
        theirs = case["answer"]
        if case["q"] == BS4_BR:
            theirs = {"translatedText": theirs["translatedText"].replace(
                "<br>Zwei Frauen sitzen im Gras.</br>", "<br/>Zwei Frauen sitzen im Gras.")}
        yield "html (JSON)", f"html[{number}]", post("/translate", {
            "q": case["q"], "source": "en", "target": "de", "format": "html"}), theirs
    for number, case in enumerate(LT["batches"]):
        yield "lists of q (JSON)", f"batches[{number}]", post("/translate", {
            "q": case["q"], "source": "en", "target": "de"}), case["answer"]
    for number, case in enumerate(LT["alternatives"]):
        yield "alternatives (JSON)", f"alternatives[{number}]", post("/translate", {
            "q": case["q"], "source": "en", "target": "de",
            "alternatives": case["alternatives"]}), case["answer"]
    for kind in ("auto", "auto_lists"):
        for number, case in enumerate(LT.get(kind, [])):
            yield "source auto (JSON)", f"{kind}[{number}]", post("/translate", {
                "q": case["q"], "source": "auto", "target": "de"}), case["answer"]


def other_cases() -> Iterator[Case]:
    for number, case in enumerate(LT["detect"]):
        yield "detect (libretranslatepy)", f"detect[{number}]", \
            client_call("detect", case["q"]), case["answer"]
    for number, case in enumerate(LT.get("detect_lists", [])):
        yield "detect, lists (JSON)", f"detect_lists[{number}]", \
            post("/detect", {"q": case["q"]}), case["answer"]
    for number, case in enumerate(LT["files"]):
        def ask(url, case=case):
            disposition, data = translate_file(url, case["name"], case["content"].encode())
            return {"disposition": disposition, "translated": data.decode("utf-8")}
        yield "files .txt .html .srt (multipart)", f"files[{number}] {case['name']}", ask, \
            {"disposition": case["disposition"], "translated": case["translated"]}
    for number, case in enumerate(LT.get("docx", [])):
        def ask_docx(url, case=case):
            disposition, data = translate_file(url, case["name"],
                                               base64.b64decode(case["content_base64"]))
            return {"disposition": disposition, "runs": docx_runs(data)}
        yield "files .docx (multipart)", f"docx[{number}]", ask_docx, \
            {"disposition": case["disposition"], "runs": case["translated_runs"]}


def get(path: str, drop=()) -> Callable[[str], object]:
    def ask(url: str):
        answer = httpx.get(url + path, timeout=60).json()
        return {k: v for k, v in answer.items() if k not in drop} if drop else answer
    return ask


# LibreTranslate's frontend settings that differ by design: its charLimit is -1 (none), and it
# lists nine file formats where this server translates four
SETTINGS_DIFFER = ("charLimit", "supportedFilesFormat")


def listing_cases() -> Iterator[Case]:
    if "languages" in LT:
        # The recording serves its package twice (see make_libretranslate.py): each target
        # is listed once per copy there
        theirs = [dict(lang, targets=sorted(set(lang["targets"]))) for lang in LT["languages"]]
        yield "languages (libretranslatepy)", "languages", client_call("languages"), theirs
    if "settings" in LT:
        theirs = {k: v for k, v in LT["settings"].items() if k not in SETTINGS_DIFFER}
        yield "frontend settings, less " + " and ".join(SETTINGS_DIFFER), "settings", \
            get("/frontend/settings", SETTINGS_DIFFER), theirs


def cases() -> List[Case]:
    return list(text_cases()) + list(other_cases()) + list(listing_cases())


def measure(url: str) -> "OrderedDict[str, Dict[str, list]]":
    """Per kind of request: the names of the cases answered as LibreTranslate answers, and
    those answered otherwise (with both answers)."""
    table: "OrderedDict[str, Dict[str, list]]" = OrderedDict()
    for kind, name, ask, theirs in cases():
        row = table.setdefault(kind, {"equal": [], "differ": []})
        ours = ask(url)
        if ours == theirs:
            row["equal"].append(name)
        else:
            row["differ"].append((name, ours, theirs))
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--packages", default=FP32)
    args = parser.parse_args()
    server = Server(args.packages, "-lanes", "2")
    try:
        table = measure(server.url)
    finally:
        server.stop()
    print("| request | identical answers |\n|---|---|")
    for kind, row in table.items():
        total = len(row["equal"]) + len(row["differ"])
        print(f"| {kind} | {len(row['equal'])} of {total} |")
    for kind, row in table.items():
        for name, ours, theirs in row["differ"]:
            print(f"\n{name}:\n  ours:   {ours!r}\n  theirs: {theirs!r}", file=sys.stderr)


if __name__ == "__main__":
    main()
