"""LibreTranslate's own client against onmt_lite's server: ``onmt_lite serve -argos_packages``
serving the Argos package LibreTranslate 1.9.6 served for tests/reference/libretranslate.json,
every recorded request asked again (libretranslatepy for texts, detect and languages; plain
JSON and multipart through httpx for html, lists, alternatives, source auto and files), each
answer equal to LibreTranslate's (tests/libre_agreement.py; its table is docs/serving.md's)."""
import os

import pytest

pytest.importorskip("fastapi", reason="the server needs the serve extra (fastapi)")
pytest.importorskip("spacy", reason="LibreTranslate's sentences need spaCy (serve extra)")
pytest.importorskip("langdetect", reason="language detection needs langdetect (serve extra)")
pytest.importorskip("docx", reason=".docx files need python-docx (serve extra)")
pytest.importorskip("srt", reason=".srt files need srt (serve extra)")
pytest.importorskip("libretranslatepy", reason="needs libretranslatepy (test extra)")
httpx = pytest.importorskip("httpx", reason="the server tests need httpx")

import libre_agreement  # noqa: E402

pytestmark = pytest.mark.skipif(
    not os.path.isdir(libre_agreement.FP32),
    reason=f"no Argos packages in {libre_agreement.FP32} (made by "
           "../shared/peers/make-argos-package.sh; ONMT_LITE_ARGOS_PACKAGES names another "
           "folder)")


@pytest.fixture(scope="module")
def server():
    running = libre_agreement.Server(libre_agreement.FP32, "-lanes", "2")
    yield running
    running.stop()


def test_every_recorded_answer_is_libretranslates(server):
    table = libre_agreement.measure(server.url)
    assert set(table) >= {"texts (libretranslatepy)", "html (JSON)", "alternatives (JSON)",
                          "detect (libretranslatepy)", "languages (libretranslatepy)",
                          "files .txt .html .srt (multipart)", "files .docx (multipart)"}
    differ = [case for row in table.values() for case in row["differ"]]
    assert differ == [], f"{len(differ)} answers differ from LibreTranslate's: {differ[:3]}"


def test_a_paragraph_through_the_client_and_as_json(server):
    from libretranslatepy import LibreTranslateAPI
    case = next(c for c in libre_agreement.LT["texts"] if c["q"].count(". ") >= 3)
    theirs = case["answer"]["translatedText"]
    assert LibreTranslateAPI(server.url).translate(case["q"], "en", "de") == theirs
    answer = httpx.post(server.url + "/translate",
                        json={"q": case["q"], "source": "en", "target": "de"}, timeout=300)
    assert answer.json() == {"translatedText": theirs}


def test_a_translated_file_is_downloaded_once(server):
    case = libre_agreement.LT["files"][0]
    answer = httpx.post(server.url + "/translate_file", data={"source": "en", "target": "de"},
                        files={"file": (case["name"], case["content"].encode())}, timeout=300)
    url = answer.json()["translatedFileUrl"]
    assert url.startswith(server.url + "/download_file/") and url.endswith(".story_de.txt")
    assert httpx.get(url).text == case["translated"]
    gone = httpx.get(url)
    assert gone.status_code == 404 and "error" in gone.json()
