"""Argos Translate packages (argos.py) as models: folders and .argosmodel zips read safely, raw
text in and out as argos-translate-lt passes it, its decoding defaults where the user gives
none, and one clear message for each thing that is wrong with a package.

A tiny package is built here from tests/reference/ct2_tiny/marian_float32 and the tiny Marian
model's sentencepiece model. The packages of the sentencepiece fixture that
../shared/peers/make-argos-package.sh makes are tested where ONMT_LITE_ARGOS_PACKAGES (default
~/argos-pkgs) holds them, against argos's own translations (tests/reference/argos.json, made by
tests/reference/make_argos.py).
"""
import json
import logging
import os
import shutil
import stat
import struct
import subprocess
import sys
import zipfile

import pytest
import sentencepiece
from conftest import ROOT

from onmt_lite.argos import ArgosTokenizer
from onmt_lite.checkpoint import CheckpointError, load_checkpoint
from onmt_lite.translate import build_translator

REFERENCE = os.path.join(ROOT, "tests", "reference")
SPM = os.path.join(REFERENCE, "marian_tiny", "source.spm")
LINES = ["A man is riding a bike.", "Two dogs play in the park near water", "",
         "The small child is walking with a big red ball.", "a woman_with a cat"]
NAME = "translate-en_de-1_0"
METADATA = {"package_version": "1.0", "argos_version": "1.0", "from_code": "en",
            "from_name": "English", "to_code": "de", "to_name": "German", "type": "translate"}
PACKAGES = os.path.expanduser(os.environ.get("ONMT_LITE_ARGOS_PACKAGES", "~/argos-pkgs"))
with open(os.path.join(REFERENCE, "argos.json"), encoding="utf-8") as f:
    ARGOS = json.load(f)


def make_package(root, metadata=None) -> str:
    folder = os.path.join(str(root), NAME)
    shutil.copytree(os.path.join(REFERENCE, "ct2_tiny", "marian_float32"),
                    os.path.join(folder, "model"))
    shutil.copy(SPM, os.path.join(folder, "sentencepiece.model"))
    with open(os.path.join(folder, "metadata.json"), "w") as f:
        json.dump(METADATA if metadata is None else metadata, f)
    return folder


def zip_folder(folder: str, members=None) -> str:
    """The .argosmodel of ``folder`` (its files under one top-level folder), or of
    ``members`` ({name: bytes}) as given."""
    path = folder + ".argosmodel"
    with zipfile.ZipFile(path, "w") as z:
        if members is not None:
            for name, data in members.items():
                z.writestr(name, data)
            return path
        for place, _, files in os.walk(folder):
            for name in files:
                full = os.path.join(place, name)
                z.write(full, os.path.relpath(full, os.path.dirname(folder)))
    return path


def texts(model: str, lines=LINES, **options):
    return [t.texts[0] for t in build_translator({"model": model, **options}).translate(lines)]


def test_a_package_reads_raw_text_and_decodes_as_argos(tmp_path, caplog):
    """The package translates as its CTranslate2 model under argos's translate_batch arguments
    on the sentencepiece pieces, decoded as argos decodes (``_`` too becomes a space)."""
    package = make_package(tmp_path)
    with caplog.at_level(logging.INFO, logger="onmt_lite"):
        ours = texts(package)
    assert "the package's decoding defaults apply (Argos Translate's): -search ctranslate2, " \
           "-beam_size 4, -alpha 0.2, -replace_unk" in caplog.text
    spm = sentencepiece.SentencePieceProcessor(model_file=SPM)
    pieces = [" ".join(spm.encode(line, out_type=str)) for line in LINES]
    plain = build_translator({"model": os.path.join(package, "model"), "search": "ctranslate2",
                              "beam_size": 4, "alpha": 0.2, "replace_unk": True}
                             ).translate(pieces)
    expected = [spm.decode_pieces(t.preds[0]).replace("\u2581", " ").replace("_", " ")
                for t in plain]
    assert ours == [text[1:] if text.startswith(" ") else text for text in expected]
    assert ours[2] == ""


def test_options_given_override_the_package_defaults(tmp_path, caplog):
    package = make_package(tmp_path)
    with caplog.at_level(logging.INFO, logger="onmt_lite"):
        greedy = texts(package, beam_size=1, alpha=1.0, search="ctranslate2")
    assert "defaults apply (Argos Translate's): -replace_unk" in caplog.text
    assert greedy == texts(package, beam_size=1, search="ctranslate2", alpha=1.0,
                           replace_unk=True)


def test_the_argosmodel_zip_translates_as_the_folder(tmp_path):
    package = make_package(tmp_path)
    assert texts(zip_folder(package)) == texts(package)


def test_the_tokenizer_decodes_as_argos():
    tokenizer = ArgosTokenizer({"sentencepiece": open(SPM, "rb").read()}, SPM)
    pieces = tokenizer.encode("A man is riding_a bike.")
    assert pieces == ["\u2581A", "\u2581man", "\u2581is", "\u2581riding", "_", "a",
                      "\u2581bike", "."]  # nothing added: no </s>
    assert tokenizer.decode(pieces) == "A man is riding a bike."
    assert tokenizer.decode(["\u2581", "T", "w", "o"]) == "Two"


# -- what is refused --------------------------------------------------------------------------
@pytest.mark.parametrize("members,message", [
    ({"../evil/metadata.json": b"{}"}, "member '../evil/metadata.json' would be written outside"),
    ({"/abs/metadata.json": b"{}"}, "member '/abs/metadata.json' would be written outside"),
    ({"a/metadata.json": b"{}", "b/metadata.json": b"{}"}, "holds 2 top-level entries"),
    ({f"{NAME}/model/config.json": b"{}"}, r"\(metadata.json\): missing"),
])
def test_unsafe_or_incomplete_zips_are_refused(tmp_path, members, message):
    path = zip_folder(str(tmp_path / NAME), members)
    with pytest.raises(CheckpointError, match=rf"{path}.*{message}"):
        load_checkpoint(path)
    assert sorted(os.listdir(tmp_path)) == [NAME + ".argosmodel"]  # nothing written beside it


def test_a_link_in_the_zip_is_refused(tmp_path):
    path = str(tmp_path / (NAME + ".argosmodel"))
    with zipfile.ZipFile(path, "w") as z:
        info = zipfile.ZipInfo(f"{NAME}/model")
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        z.writestr(info, "/etc")
    with pytest.raises(CheckpointError, match=f"member '{NAME}/model' is a symbolic link"):
        load_checkpoint(path)


def test_a_bad_zip_is_refused_naming_the_file(tmp_path):
    path = str(tmp_path / "broken.argosmodel")
    with open(path, "wb") as f:
        f.write(b"PK\x03\x04 not really a zip")
    with pytest.raises(CheckpointError, match=rf"{path}: not a readable .argosmodel \(a zip "):
        load_checkpoint(path)


def test_an_unknown_model_version_in_a_zip_names_the_package(tmp_path):
    package = make_package(tmp_path)
    with open(os.path.join(package, "model", "model.bin"), "r+b") as f:
        f.write(struct.pack("<I", 9))
    path = zip_folder(package)
    with pytest.raises(CheckpointError, match=rf"{path} \({NAME}\)/model/model.bin: unknown "
                                              "CTranslate2 model.bin version 9"):
        load_checkpoint(path)


@pytest.mark.parametrize("change,message", [
    (lambda m: m.pop("to_code"), "lacks to_code"),
    (lambda m: m.update(target_prefix="__de__"), "target_prefix '__de__' is not supported"),
    (lambda m: m.update(type="sbd"), "type 'sbd'; only translate packages"),
])
def test_metadata_errors_name_the_file(tmp_path, change, message):
    metadata = dict(METADATA)
    change(metadata)
    package = make_package(tmp_path, metadata)
    with pytest.raises(CheckpointError, match=rf"{package}/metadata.json: {message}"):
        load_checkpoint(package)


def test_invalid_metadata_and_a_missing_one(tmp_path):
    package = make_package(tmp_path)
    with open(os.path.join(package, "metadata.json"), "w") as f:
        f.write("{not json")
    with pytest.raises(CheckpointError, match=r"metadata.json: not valid JSON"):
        load_checkpoint(package)
    os.remove(os.path.join(package, "metadata.json"))
    with pytest.raises(CheckpointError, match=r"is a directory; .*an Argos Translate package "
                                              r"\(with metadata.json\)"):
        load_checkpoint(package)


def test_a_package_without_its_sentencepiece_model(tmp_path):
    package = make_package(tmp_path)
    os.remove(os.path.join(package, "sentencepiece.model"))
    with pytest.raises(CheckpointError, match=f"{package}: no sentencepiece.model"):
        load_checkpoint(package)


# -- the fixture's packages (ONMT_LITE_ARGOS_PACKAGES) -------------------------------------
def real_package(kind: str) -> str:
    folder = os.path.join(PACKAGES, kind, NAME)
    if not os.path.isfile(os.path.join(folder, "metadata.json")):
        pytest.skip(f"no Argos package in {folder} (ONMT_LITE_ARGOS_PACKAGES; make it with "
                    "../shared/peers/make-argos-package.sh)")
    return folder


def test_translate_py_on_the_fp32_package_is_argos(tmp_path):
    package = real_package("fp32")
    ref = ARGOS["packages"]["fp32"]
    source, output = tmp_path / "src.en", tmp_path / "out.de"
    source.write_text("\n".join(ref["lines"]) + "\n", encoding="utf-8")
    subprocess.run([sys.executable, os.path.join(ROOT, "translate.py"), "-model", package,
                    "-src", str(source), "-output", str(output)], check=True,
                   capture_output=True)
    assert output.read_text(encoding="utf-8").splitlines() == ref["translations"]


def test_the_fp32_argosmodel_is_argos():
    path = real_package("fp32") + ".argosmodel"
    ref = ARGOS["packages"]["fp32"]
    assert texts(path, ref["lines"][:40]) == ref["translations"][:40]
