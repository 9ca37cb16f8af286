"""onmt_lite serve -argos_packages DIR: every Argos Translate package in a folder served, its
languages from its metadata.json."""
import json
import logging
import os
import zipfile

import pytest

pytest.importorskip("fastapi", reason="the server needs the serve extra (fastapi)")

from onmt_lite.cli import serve as serve_command  # noqa: E402
from onmt_lite.serve.config import ConfError, read_argos_packages  # noqa: E402

PACKAGES = os.environ.get("ONMT_LITE_ARGOS_PACKAGES",
                          os.path.expanduser(os.path.join("~", "argos-pkgs")))
FP32 = os.path.join(PACKAGES, "fp32")


def _metadata(src: str, tgt: str) -> str:
    return json.dumps({"package_version": "1.0", "from_code": src, "to_code": tgt,
                       "type": "translate"})


def _folder(root, name: str, src: str, tgt: str):
    folder = root / name
    folder.mkdir()
    (folder / "metadata.json").write_text(_metadata(src, tgt))
    return folder


def _zip(root, name: str, src: str, tgt: str, metadata: bool = True):
    path = root / f"{name}.argosmodel"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}/README.md", "a package\n")
        if metadata:
            archive.writestr(f"{name}/metadata.json", _metadata(src, tgt))
    return path


def test_every_package_of_the_folder_is_served_once_a_pair(tmp_path, caplog):
    _folder(tmp_path, "translate-en_de-1_0", "en", "de")
    _zip(tmp_path, "translate-en_de-1_0", "en", "de")  # the folder's own zip: left out
    _zip(tmp_path, "translate-de_en-1_0", "de", "en")
    _folder(tmp_path, "translate-en_fr-1_9", "en", "fr")
    (tmp_path / "notes.txt").write_text("not a package\n")
    (tmp_path / "empty").mkdir()  # a folder without metadata.json: not a package
    with caplog.at_level(logging.INFO, logger="onmt_lite"):
        specs = read_argos_packages(str(tmp_path), {"beam_size": 2})
    assert [(s.id, os.path.basename(s.path), s.src_lang, s.tgt_lang) for s in specs] == [
        (0, "translate-en_de-1_0", "en", "de"), (1, "translate-en_fr-1_9", "en", "fr"),
        (2, "translate-de_en-1_0.argosmodel", "de", "en")]
    assert all(not s.load and s.opt == {"beam_size": 2} for s in specs)  # at a first request
    assert [r.getMessage() for r in caplog.records] == [
        "-argos_packages: translate-en_de-1_0.argosmodel is left out: translate-en_de-1_0 "
        "serves en to de"]


def test_a_folder_without_packages_or_with_a_broken_one_is_refused_by_name(tmp_path):
    with pytest.raises(ConfError, match="no Argos Translate package in it"):
        read_argos_packages(str(tmp_path), {})
    with pytest.raises(ConfError, match="not a folder"):
        read_argos_packages(str(tmp_path / "absent"), {})
    bad = _zip(tmp_path, "translate-en_es-1_0", "en", "es", metadata=False)
    with pytest.raises(ConfError, match=f"{bad}: no metadata.json"):
        read_argos_packages(str(tmp_path), {})
    bad.unlink()
    (tmp_path / "broken.argosmodel").write_bytes(b"not a zip")
    with pytest.raises(ConfError, match="broken.argosmodel: not a readable .argosmodel"):
        read_argos_packages(str(tmp_path), {})
    (tmp_path / "broken.argosmodel").unlink()
    folder = _folder(tmp_path, "translate-en_it-1_0", "en", "it")
    (folder / "metadata.json").write_text(json.dumps({"from_code": "en", "type": "translate"}))
    with pytest.raises(ConfError, match="lacks to_code"):
        read_argos_packages(str(tmp_path), {})


def test_the_command_takes_one_source_of_models(tmp_path, capsys):
    _folder(tmp_path, "translate-en_de-1_0", "en", "de")
    assert serve_command.main(["-argos_packages", str(tmp_path), "-model", "x.pt"]) == 2
    assert "give one of -model" in capsys.readouterr().err
    assert serve_command.main(["-argos_packages", str(tmp_path / "nothing")]) == 2
    assert "not a folder" in capsys.readouterr().err


@pytest.mark.skipif(not os.path.isdir(FP32), reason=f"no Argos packages in {FP32} (made by "
                    "../shared/peers/make-argos-package.sh; ONMT_LITE_ARGOS_PACKAGES names "
                    "another folder)")
def test_a_served_package_answers_as_translate_py_with_the_package():
    from test_serve import app_for

    from onmt_lite.translate.build import build_translator
    lines = ["A man rides a bike.", "Two dogs play in the snow.", "A woman is reading."]
    package = os.path.join(FP32, "translate-en_de-1_0")
    expected = [t.output_lines()[0] for t in build_translator({"model": package}).translate(lines)]
    with app_for(read_argos_packages(FP32, {})) as client:
        assert client.get("/languages").json() == [
            {"code": "en", "name": "English", "targets": ["de", "en"]},
            {"code": "de", "name": "German", "targets": ["de"]}]
        answer = client.post("/translate", json={"q": lines, "source": "en", "target": "de"})
        assert answer.status_code == 200, answer.text
        assert answer.json()["translatedText"] == expected
