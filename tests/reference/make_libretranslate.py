"""Makes tests/reference/libretranslate.json: LibreTranslate's own answers (its /translate in text
and html, lists of q, alternatives, source auto, /translate_file with .txt, .html, .srt and a
.docx made here, /detect, /languages, /frontend/settings) on the Argos package of the
OpenNMT-py sentencepiece fixture, with what lies under them: the sentences its splitter cuts
each paragraph into, each sentence's own n-best translations, and, for html, each text its
html translation asked the model for with that text's translation. test_libre_segments.py
checks onmt_lite's segmentation, rejoining and html reassembly against them without a model;
test_libre_server.py checks onmt_lite's server end to end.

LibreTranslate is not a dependency: run this with its virtualenv (LibreTranslate 1.9.6 and
argos-translate-lt, ../shared/peers/setup-libretranslate.sh) from the repository root, once
the package exists (../shared/peers/make-argos-package.sh ... ~/argos-pkgs/fp32 float32):

    ~/libretranslate-venv/bin/python tests/reference/make_libretranslate.py \
        [--packages ~/argos-pkgs/fp32] [--venv ~/libretranslate-venv]

It starts LibreTranslate with ../shared/peers/libretranslate-offline.sh (ARGOS_CHUNK_TYPE=SPACY:
spaCy's rule-based sentencizer on a blank pipeline of the source language, the one the package
holds) with ARGOS_INTER_THREADS=2 ARGOS_INTRA_THREADS=1, and stops it at the end. The same
package is loaded here too, with the same settings, to call its sentencizer and its
translation directly. LibreTranslate is given a folder where the package is linked twice:
with fewer than two packages installed, its start-up downloads the package index and MiniSBD's
models, ten tries each with doubling waits (many minutes offline); the second link only
repeats the en->de translation, which its lookups take from the first.
"""
import argparse
import base64
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
import xml.etree.ElementTree as ElementTree
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SHARED = os.path.join(ROOT, "..", "shared")

TEXTS = [
    "A man is riding a bike.",
    "Two dogs play in the snow",
    "a little girl climbs a tree.",
    "A MAN IS RUNNING. A DOG BARKS.",
    "A man rides a bike. A dog runs in the park. Two women are talking.",
    "A man is sitting on a bench. He reads a newspaper while a woman feeds the pigeons. "
    "Children are playing in the background. The sun is shining.",
    "A man rides a bike.\nA dog runs in the park.",
    "A man rides a bike.\n\nA dog runs in the park.\n",
    "\n\nA dog runs on the beach.",
    "A woman sings on a stage.\n\n",
    "A man rides a bike. A dog runs.\nTwo women talk. A boy laughs.\n\nThe end.",
    "A man rides a bike.   A dog runs in the park.",
    "  A man is walking down the street.  ",
    "A man\tis walking. A boy sings.",
    "A man rides a bike A dog runs in the park",
    "Dr. Smith is talking to a woman. She is 3.5 meters tall.",
    "Mr. and Mrs. Brown walk the dog at 5 p.m. on Main St. every day.",
    "The U.S. team won 2-1. The fans cheer.",
    "It costs $4.50. That is cheap!",
    "He said, \"A dog is running.\" Then he left.",
    "'Look at the man!' she shouted. The man waved.",
    "Is the man riding a bike? Yes! He is.",
    "A man waits... A bus arrives.",
    "A man (in a red shirt) climbs a rock. See fig. 2 for details.",
    "Two men are working on a roof.A dog sleeps.",
    "A man is riding a bike .",
    "A boy jumps into the water, a girl watches; a dog barks.",
    "a man rides a bike. a dog runs.",
]

HTML = [
    "<p>A man is riding a bike.</p>",
    "<p>A man rides a <b>red</b> bike. A dog runs in the park.</p>",
    "<div><p>A man is <em>riding a <b>bike</b></em>.</p><p>Two women talk.</p></div>",
    '<p class="intro" title="A man">A dog runs in the <a href="/park?a=1&amp;b=2">park</a>.</p>',
    "<p>Tom &amp; Jerry are running. 3 &lt; 5.</p>",
    "<p>A man&nbsp;is walking.</p>",
    "A man rides a bike.<br>A dog runs.<br/>Two women talk.",
    "<p>The <i>young</i> boy plays with a <span style=\"color:red\">ball</span>.</p>",
    "<p>A man types <code>print(x)</code> on a laptop.</p>",
    '<p translate="no">A man runs.</p><p>A woman runs.</p>',
    "A man is riding a bike. A dog runs.",
    "<ul><li>A red car.</li><li>A blue bike.</li></ul>",
    "<p>A dog<!-- a note --> runs.</p>",
    "<h1>A day at the beach</h1>\n<p>Children build a sand castle.\nTheir parents sleep.</p>",
    "<table><tr><td>A cat</td><td>sleeps on a sofa.</td></tr></table>",
    "<p>A man rides a <b>red bike</b> and a woman walks a <i>small dog</i> in the park.</p>",
]

BATCHES = [
    ["A man rides a bike. A dog runs.", "Two women talk.", ""],
    ["A boy plays.\nA girl sings.", "Dr. Smith is here."],
]

ALTERNATIVES = [
    "A man is riding a bike.",
    "A man rides a bike. A dog runs in the park.",
    "A man rides a bike.\nA dog runs in the park.",
]

FILES = {
    "story.txt": "A man rides a bike. A dog runs in the park.\nTwo women are talking.\n\n"
                 "Children play football. The sun is shining.\n",
    "page.html": "<!DOCTYPE html><html><head><title>A day at the beach</title></head>"
                 "<body><p>A man rides a <b>red</b> bike. A dog runs.</p></body></html>\n",
    "subtitles.srt": "1\n00:00:01,000 --> 00:00:03,000\nA man rides a bike.\n\n"
                     "2\n00:00:04,000 --> 00:00:06,500\nA dog runs in the park.\nTwo women talk.\n",
}

DETECT = ["A man is riding a bike in the park.", "Ein Mann fährt Fahrrad im Park.",
          "Hello", "Hallo, wie geht es dir?"]

# /detect and source auto with a list q: one detection over all texts
DETECT_LISTS = [["Hello", "Ein Mann fährt Fahrrad im Park."],
                ["A man is riding a bike.", "Two dogs play in the snow", "A woman sings."]]

W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
DOCX_PARTS = {
    "[Content_Types].xml":
        '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
        '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
        '<Default Extension="rels" '
        'ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
        '<Default Extension="xml" ContentType="application/xml"/>'
        '<Override PartName="/word/document.xml" ContentType="application/'
        'vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/>'
        '<Override PartName="/word/header1.xml" ContentType="application/'
        'vnd.openxmlformats-officedocument.wordprocessingml.header+xml"/></Types>',
    "_rels/.rels":
        '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
        '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
        '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/'
        'relationships/officeDocument" Target="word/document.xml"/></Relationships>',
    "word/_rels/document.xml.rels":
        '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
        '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
        '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/'
        'relationships/header" Target="header1.xml"/></Relationships>',
    "word/header1.xml":
        f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?><w:hdr xmlns:w="{W}">'
        '<w:p><w:r><w:t>A day at the beach</w:t></w:r></w:p></w:hdr>',
    "word/document.xml":
        f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?><w:document xmlns:w="{W}" '
        'xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships">'
        '<w:body>'
        '<w:p><w:r><w:t>A man rides a bike. A dog runs in the park.</w:t></w:r></w:p>'
        '<w:p><w:r><w:t xml:space="preserve">A man rides a </w:t></w:r>'
        '<w:r><w:rPr><w:b/></w:rPr><w:t>red</w:t></w:r>'
        '<w:r><w:t xml:space="preserve"> bike.</w:t></w:r></w:p>'
        '<w:p/>'
        '<w:tbl><w:tr><w:tc><w:p><w:r><w:t>Two women are talking.</w:t></w:r></w:p></w:tc>'
        '<w:tc><w:p><w:r><w:t>Children play football.</w:t></w:r></w:p></w:tc></w:tr></w:tbl>'
        '<w:p><w:r><w:t>The sun is shining.</w:t></w:r></w:p>'
        '<w:sectPr><w:headerReference w:type="default" r:id="rId1"/></w:sectPr>'
        '</w:body></w:document>',
}


def docx_bytes() -> bytes:
    """A small .docx made here (no Word library needed): a body with a paragraph of two
    sentences, one of three runs (a bold word), an empty one, a table of two cells and a last
    paragraph, and a header."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, text in DOCX_PARTS.items():
            archive.writestr(zipfile.ZipInfo(name, (2020, 1, 1, 0, 0, 0)), text)
    return out.getvalue()


def docx_runs(data: bytes) -> dict:
    """The text of every w:t of a .docx's body and header, in order, per part."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {name: [t.text or "" for t in ElementTree.fromstring(archive.read(name)).iter(
                    f"{{{W}}}t")]
                for name in ("word/document.xml", "word/header1.xml")}


def argos_environment(packages: str, state: str) -> None:
    """The settings libretranslate-offline.sh gives LibreTranslate, set before argostranslate
    is imported (it reads them at import)."""
    os.environ.update(
        XDG_DATA_HOME=os.path.join(state, "data"), XDG_CONFIG_HOME=os.path.join(state, "config"),
        XDG_CACHE_HOME=os.path.join(state, "cache"), ARGOS_PACKAGES_DIR=packages,
        ARGOS_CHUNK_TYPE="SPACY", ARGOS_INTER_THREADS="2", ARGOS_INTRA_THREADS="1")
    import spacy
    spacy_dir = os.path.join(state, "cache", "argos-translate", "spacy")
    os.makedirs(os.path.join(spacy_dir, "senter", "model"), exist_ok=True)
    os.makedirs(os.path.join(state, "data", "argos-translate"), exist_ok=True)
    with open(os.path.join(state, "data", "argos-translate", "index.json"), "w") as f:
        f.write("[]")
    spacy.blank("xx").to_disk(spacy_dir)


class Recorder:
    """An Argos translation that records every text it is asked to translate, with its
    answer: what translate_html asks the model for."""

    def __init__(self, underlying):
        self.underlying, self.calls = underlying, []
        self.from_lang, self.to_lang = underlying.from_lang, underlying.to_lang

    def translate(self, text: str) -> str:
        answer = self.underlying.translate(text)
        self.calls.append([text, answer])
        return answer


def in_process(texts, html_texts):
    """Segmentation, each sentence's n-best translations and the html calls, from the package
    loaded here."""
    from argostranslate import translate
    from argostranslatefiles.translatehtml import translate_html
    cached = translate.get_translation_from_codes("en", "de")
    package_translation = cached.underlying
    sentencizer = package_translation.sentencizer
    html_calls = []
    for text in html_texts:
        recorder = Recorder(cached)
        translate_html(recorder, text)
        html_calls.append(recorder.calls)
    splits = {}
    sentences = set()
    everything = list(texts) + [t for batch in BATCHES for t in batch] + ALTERNATIVES + \
        [c[0] for calls in html_calls for c in calls] + \
        [line for text in FILES.values() for line in text.split("\n")] + \
        [run for runs in docx_runs(docx_bytes()).values() for run in runs]
    for text in everything:
        splits[text] = [sentencizer.split_sentences(p) for p in text.split("\n")]
        sentences.update(s for para in splits[text] for s in para)
    translations = {s: [h.value for h in package_translation.hypotheses(s, 4)]
                    for s in sorted(sentences)}
    return splits, translations, html_calls


def post(port: int, path: str, body: dict):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as err:
        return {"status": err.code, "body": json.loads(err.read())}


def get(port: int, path: str):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as response:
        return json.loads(response.read())


def post_file(port: int, name: str, content) -> dict:
    """/translate_file with ``content`` (text, or bytes for a .docx) as the file ``name``, then
    its download."""
    data = content if isinstance(content, bytes) else content.encode()
    boundary = uuid.uuid4().hex
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'
             for k, v in (("source", "en"), ("target", "de"))]
    parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
                 f'filename="{name}"\r\nContent-Type: application/octet-stream\r\n\r\n')
    body = "".join(parts).encode() + data + f"\r\n--{boundary}--\r\n".encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/translate_file", data=body,
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    with urllib.request.urlopen(request, timeout=600) as response:
        answer = json.loads(response.read())
    url = answer["translatedFileUrl"]
    with urllib.request.urlopen(url, timeout=60) as response:
        disposition = response.headers.get("Content-Disposition")
        translated = response.read()
    if isinstance(content, bytes):
        return {"name": name, "content_base64": base64.b64encode(content).decode("ascii"),
                "url": url.split("/download_file/")[0], "disposition": disposition,
                "runs": docx_runs(content), "translated_runs": docx_runs(translated)}
    return {"name": name, "content": content, "url": url.split("/download_file/")[0],
            "disposition": disposition, "translated": translated.decode("utf-8")}


def linked_twice(packages: str, work: str) -> str:
    """A folder holding each package of ``packages`` twice (links), see the docstring."""
    folder = os.path.join(work, "packages")
    os.makedirs(folder)
    for name in sorted(os.listdir(packages)):
        path = os.path.join(packages, name)
        if os.path.isdir(path):
            os.symlink(path, os.path.join(folder, name))
            os.symlink(path, os.path.join(folder, name + "-again"))
    return folder


def start_server(venv: str, packages: str, port: int) -> subprocess.Popen:
    env = dict(os.environ, ARGOS_INTER_THREADS="2", ARGOS_INTRA_THREADS="1")
    server = subprocess.Popen(
        ["bash", os.path.join(SHARED, "peers", "libretranslate-offline.sh"), venv, packages,
         str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/languages", timeout=5)
            return server
        except OSError:
            if server.poll() is not None:
                raise SystemExit("LibreTranslate ended before it answered")
            time.sleep(0.5)
    server.terminate()
    raise SystemExit("LibreTranslate did not answer within 300 s")


def over_http(port: int) -> dict:
    """LibreTranslate's answers through its server."""
    def translate(q, fmt="text", alternatives=0):
        body = {"q": q, "source": "en", "target": "de", "format": fmt}
        if alternatives:
            body["alternatives"] = alternatives
        return post(port, "/translate", body)
    return {
        "texts": [{"q": q, "answer": translate(q)} for q in TEXTS],
        "html": [{"q": q, "answer": translate(q, "html")} for q in HTML],
        "batches": [{"q": q, "answer": translate(q)} for q in BATCHES],
        "alternatives": [{"q": q, "alternatives": 3, "answer": translate(q, alternatives=3)}
                         for q in ALTERNATIVES],
        "auto": [{"q": q, "answer": post(port, "/translate", {"q": q, "source": "auto",
                                                               "target": "de"})}
                 for q in TEXTS[:2]],
        "files": [post_file(port, name, content) for name, content in FILES.items()],
        "detect": [{"q": q, "answer": post(port, "/detect", {"q": q})} for q in DETECT],
        "docx": [post_file(port, "letter.docx", docx_bytes())],
        "detect_lists": [{"q": q, "answer": post(port, "/detect", {"q": q})}
                         for q in DETECT_LISTS],
        "auto_lists": [{"q": q, "answer": post(port, "/translate", {
            "q": q, "source": "auto", "target": "de"})} for q in DETECT_LISTS],
        "languages": get(port, "/languages"),
        "settings": get(port, "/frontend/settings"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--packages", default=os.path.expanduser("~/argos-pkgs/fp32"))
    parser.add_argument("--venv", default=os.path.expanduser("~/libretranslate-venv"))
    args = parser.parse_args()
    packages = os.path.abspath(args.packages)
    state = tempfile.mkdtemp()
    argos_environment(packages, state)
    splits, translations, html_calls = in_process(TEXTS, HTML)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = start_server(args.venv, linked_twice(packages, state), port)
    try:
        answers = over_http(port)
    finally:
        server.terminate()
        server.wait()
    for case, calls in zip(answers["html"], html_calls):
        case["calls"] = calls
    from importlib.metadata import version
    out = {"made_by": "tests/reference/make_libretranslate.py",
           "versions": {name: version(name) for name in (
               "libretranslate", "argos-translate-lt", "argos-translate-files", "spacy",
               "beautifulsoup4", "ctranslate2", "sentencepiece", "langdetect")},
           "package": os.path.basename(packages), "source": "en", "target": "de",
           "segments": splits, "sentence_translations": translations, **answers}
    with open(os.path.join(HERE, "libretranslate.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {os.path.join(HERE, 'libretranslate.json')}", file=sys.stderr)


if __name__ == "__main__":
    main()
