"""LibreTranslate's files and language detection without a model: each format's texts and its
rebuilding, the store of translated files, the names, the bounds an upload meets before any
work starts, and langdetect/lexilang's answers against LibreTranslate 1.9.6's recorded ones."""
import base64
import io
import json
import os
import zipfile

import pytest

pytest.importorskip("fastapi", reason="the server needs the serve extra (fastapi)")
pytest.importorskip("bs4", reason="html needs beautifulsoup4 (serve extra)")
docx = pytest.importorskip("docx", reason=".docx files need python-docx (serve extra)")
pytest.importorskip("srt", reason=".srt files need srt (serve extra)")

from fastapi.testclient import TestClient  # noqa: E402

from onmt_lite.serve import libre_files  # noqa: E402
from onmt_lite.serve.app import create_app  # noqa: E402
from onmt_lite.serve.config import ModelSpec  # noqa: E402
from onmt_lite.serve.libre_file_api import FileStore  # noqa: E402
from onmt_lite.serve.limits import Limits  # noqa: E402
from onmt_lite.serve.models import Registry, Scheduling  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(ROOT, "tests", "reference", "libretranslate.json"), encoding="utf-8") as f:
    LT = json.load(f)


def upper(units):
    return [u.upper() for u in units]


def test_a_txt_file_is_one_text_with_its_line_ends_read_as_text_mode_reads_them():
    document = libre_files.open_document(".txt", b"\xef\xbb\xbfA man.\r\nA dog.\rEnd.\n")
    assert document.units == ["A man.\nA dog.\nEnd.\n"]
    assert document.render(upper(document.units)) == b"A MAN.\nA DOG.\nEND.\n"
    with pytest.raises(libre_files.FileUnreadable, match="not UTF-8"):
        libre_files.open_document(".txt", b"caf\xe9")


def test_an_html_file_keeps_its_doctype_and_entities():
    content = b"<!DOCTYPE html><p>Tom &amp; Jerry <code>x</code> run.</p>"
    document = libre_files.open_document(".html", content)
    assert document.units == ["Tom & Jerry ", " run."]
    assert document.render(["TOM & JERRY", "RUN."]) == \
        b"<!DOCTYPE html><p>TOM &amp; JERRY <code>x</code> RUN.</p>"


def test_subtitles_are_joined_translated_and_wrapped_at_40_columns():
    content = ("7\r\n00:00:01,000 --> 00:00:03,000 X1:10\r\nA man\r\nrides.\r\n\r\n"
               "9\r\n00:00:04,000 --> 00:00:06,500\r\nA dog.\r\n").encode()
    document = libre_files.open_document(".srt", content)
    assert document.units == ["A man rides.", "A dog."]
    out = document.render(["Ein Mann fährt mit seinem roten Fahrrad durch den Park.", "Hund."])
    assert out.decode() == ("7\r\n00:00:01,000 --> 00:00:03,000 X1:10\r\nEin Mann fährt mit "
                            "seinem roten Fahrrad\r\ndurch den Park.\r\n\r\n9\r\n00:00:04,000 "
                            "--> 00:00:06,500\r\nHund.\r\n\r\n")
    with pytest.raises(libre_files.FileUnreadable, match="cannot be read"):
        libre_files.open_document(".srt", b"1\nnot a time\nA man.\n")


def test_a_docx_translates_every_run_of_body_table_and_header():
    case = LT["docx"][0]
    document = libre_files.open_document(".docx", base64.b64decode(case["content_base64"]))
    runs = case["runs"]
    assert document.units == runs["word/document.xml"] + runs["word/header1.xml"]
    out = docx.Document(io.BytesIO(document.render(upper(document.units))))
    assert [p.text for p in out.paragraphs] == [
        "A MAN RIDES A BIKE. A DOG RUNS IN THE PARK.", "A MAN RIDES A RED BIKE.", "",
        "THE SUN IS SHINING."]
    assert out.sections[0].header.paragraphs[0].text == "A DAY AT THE BEACH"
    from docx.oxml.ns import qn
    assert [t.text for t in out.element.body.iter(qn("w:t"))] == \
        upper(runs["word/document.xml"])  # the table's cells too
    spaced = [t for t in out.element.body.iter(qn("w:t")) if t.text.startswith(" ")]
    assert [t.get("{http://www.w3.org/XML/1998/namespace}space") for t in spaced] == ["preserve"]


def test_a_docx_that_is_no_archive_or_unpacks_too_large_is_refused(monkeypatch):
    with pytest.raises(libre_files.FileUnreadable, match="not a zip archive"):
        libre_files.open_document(".docx", b"PK\x03\x04 not really")
    with pytest.raises(libre_files.FileUnreadable, match="cannot be read"):
        libre_files.open_document(".docx", base64.b64decode(LT["docx"][0]["content_base64"])
                                  .replace(b"word/document.xml", b"word/documenT.xml"))
    monkeypatch.setattr(libre_files, "MAX_DOCX_UNPACKED", 1000)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("word/document.xml", "<a>" + " " * 100000 + "</a>")
    with pytest.raises(libre_files.FileUnreadable, match="unpacks to 100007 bytes"):
        libre_files.open_document(".docx", out.getvalue())


@pytest.mark.parametrize("upload, name", [
    ("story.txt", "story_de.txt"), ("../../etc/passwd.txt", "etc_passwd_de.txt"),
    ("my story.v2.html", "my_story.v2_de.html"), ("été.srt", "ete_de.srt"),
    (".hidden.txt", "hidden_de.txt"), ("日本.txt", "file_de.txt")])
def test_download_names_are_sanitised(upload, name):
    extension = os.path.splitext(upload)[1]
    assert libre_files.translated_name(upload, extension, "de") == name


def test_the_store_gives_a_file_once_keeps_a_bounded_number_and_forgets_old_ones():
    store = FileStore(max_files=2, ttl=3600)
    try:
        first = store.put("a_de.txt", b"one")
        assert os.stat(store.folder).st_mode & 0o077 == 0  # the folder is private
        assert store.take(first) == b"one" and store.take(first) is None
        names = [store.put(f"{n}_de.txt", n.encode()) for n in "bcd"]
        assert store.take(names[0]) is None  # the oldest, dropped for the third
        assert store.take(names[2]) == b"d"
        for evil in ("../" + names[1], names[1] + "/..", "..", "", "x" * 300):
            assert store.take(evil) is None
        store.ttl = -1
        assert store.take(names[1]) is None and os.listdir(store.folder) == []
    finally:
        store.close()
    assert store.folder is None


def test_detection_gives_libretranslates_confidences():
    from onmt_lite.serve.detect import detect_languages
    pytest.importorskip("langdetect", reason="detection needs langdetect (serve extra)")
    for case in LT["detect"] + LT["detect_lists"]:
        assert detect_languages(case["q"], ("en", "de")) == case["answer"], case["q"]
    for case in LT["auto"] + LT["auto_lists"]:
        detected = case["answer"]["detectedLanguage"]
        best = detected[0] if isinstance(detected, list) else detected
        assert detect_languages([case["q"]] if isinstance(case["q"], str) else case["q"],
                                ("en", "de"))[0] == best


@pytest.fixture()
def client():
    """The server, its model never loaded: every request here is refused before."""
    spec = ModelSpec(0, os.path.join(ROOT, "data", "absent.pt"), {}, "en", "de", load=False)
    app = create_app(Registry([spec], Scheduling(lanes=1)),
                     Limits(max_chars=50, max_file_bytes=1000), {"key"})
    with TestClient(app) as c:
        yield c


def send(client, name="a.txt", content=b"A man.", **fields):
    fields = {"source": "en", "target": "de", "api_key": "key", **fields}
    return client.post("/translate_file", data=fields, files={"file": (name, content)})


@pytest.mark.parametrize("args, status, message", [
    ({"content": b"x" * 1001}, 413, "over the limit of 1000 bytes"),
    ({"content": "a man. " * 8}, 400, "(56 characters) is over the limit of 50"),
    ({"name": "a.pdf"}, 400, "file format not supported"),
    ({"name": "a.TXT"}, 400, "file format not supported"),
    ({"api_key": ""}, 400, "api_key is required"),
    ({"api_key": "nope"}, 403, "Invalid API key"),
    ({"target": ""}, 400, "missing target parameter"),
    ({"content": b"\xff\xfe"}, 400, "not UTF-8"),
    ({"source": "fr"}, 400, "fr is not supported"),
])
def test_an_upload_is_refused_before_any_work(client, args, status, message):
    answer = send(client, **args)
    assert answer.status_code == status and message in answer.json()["error"], answer.text


def test_requests_without_a_file_and_downloads_of_unknown_names(client):
    answer = client.post("/translate_file", data={"source": "en", "target": "de",
                                                  "api_key": "key"})
    assert answer.status_code == 400 and "missing file" in answer.json()["error"]
    for name in ("0" * 32 + ".a_de.txt", "..%2F..%2Fetc%2Fpasswd", "%2E%2E"):
        assert client.get("/download_file/" + name).status_code == 404
    settings = client.get("/frontend/settings").json()
    assert settings["filesTranslation"] is True
    assert settings["supportedFilesFormat"] == [".txt", ".docx", ".html", ".srt"]
