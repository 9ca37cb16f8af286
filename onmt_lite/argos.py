"""Argos Translate packages (what LibreTranslate serves) as onmt_lite models: an installed
package folder (``metadata.json``, ``model/`` = a CTranslate2 model directory,
``sentencepiece.model``, optionally ``stanza/`` or ``spacy/``) or its ``.argosmodel`` file (a
zip of that folder under one top-level folder).

A ``.argosmodel`` is read from a temporary directory: its members are checked first (no
absolute paths, no ``..``, no links, one top-level folder, a bounded size) and only then
written there; the directory is removed once the model is read.

Text goes in and comes out as argos-translate-lt (translate.py, ``apply_packaged_translation``)
passes it: the package's sentencepiece model encodes the line into pieces (nothing added: no
``</s>``); the output pieces are joined by ``decode_pieces``, every ``▁`` and ``_`` becomes a
space, and one leading space is dropped. onmt_lite translates each line as one text: the
package's sentence splitter (stanza, spaCy) is not run.

Decoding takes argos's ``translate_batch`` arguments where the user gives none (DEFAULTS):
CTranslate2's search, beam 4, length penalty 0.2, unknown tokens replaced by the source piece
they attend to most, and translate_batch's own defaults for the rest (at most 256 tokens, at
least 1, no limit from the source's length).
"""
import json
import os
import stat
import tempfile
import zipfile
from typing import List, Sequence

import sentencepiece

from onmt_lite.transforms import sentencepiece_pieces

SUFFIX = ".argosmodel"
MAX_UNPACKED = 8 << 30  # bytes a package may unpack to (its members' sizes as the zip states)
# translate_batch's arguments in argos's apply_packaged_translation, as onmt_lite options:
# beam_size=max(num_hypotheses, ARGOS_BEAM_SIZE=4), length_penalty=0.2, replace_unknowns=True
DEFAULTS = (("search", "ctranslate2"), ("beam_size", 4), ("alpha", 0.2), ("replace_unk", True))


class ArgosError(ValueError):
    """A package onmt_lite cannot read; the message names the file and the problem."""


def is_package(path: str) -> bool:
    """An installed package folder (with metadata.json) or a .argosmodel file."""
    if os.path.isdir(path):
        return os.path.isfile(os.path.join(path, "metadata.json"))
    return path.endswith(SUFFIX) and os.path.isfile(path)


# -- the .argosmodel zip ----------------------------------------------------------------------
def _safe_members(archive: zipfile.ZipFile, path: str) -> str:
    """The one top-level folder of ``archive``; refuses members that would land outside it
    (absolute paths, ``..``), links, and more than MAX_UNPACKED bytes."""
    tops, total = set(), 0
    for info in archive.infolist():
        name = info.filename
        parts = name.replace("\\", "/").split("/")
        if name.startswith(("/", "\\")) or ".." in parts or ":" in parts[0]:
            raise ArgosError(f"{path}: member {name!r} would be written outside the package "
                             "folder: refused")
        if stat.S_ISLNK(info.external_attr >> 16):
            raise ArgosError(f"{path}: member {name!r} is a symbolic link: refused")
        total += info.file_size
        tops.add(parts[0])
    if total > MAX_UNPACKED:
        raise ArgosError(f"{path}: unpacks to {total} bytes, more than {MAX_UNPACKED}: refused")
    if len(tops) != 1:
        raise ArgosError(f"{path}: holds {len(tops)} top-level entries ({', '.join(sorted(tops)[:3])}"
                         f"); a package is one folder")
    return tops.pop()


def _unpack(path: str, into: str) -> str:
    """Writes the checked members of the .argosmodel ``path`` under ``into``; returns the
    package folder."""
    try:
        with zipfile.ZipFile(path) as archive:
            top = _safe_members(archive, path)
            for info in archive.infolist():
                target = os.path.join(into, *info.filename.replace("\\", "/").split("/"))
                if info.is_dir():
                    os.makedirs(target, exist_ok=True)
                    continue
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with archive.open(info) as source, open(target, "wb") as out:
                    while chunk := source.read(1 << 20):
                        out.write(chunk)
    except zipfile.BadZipFile as err:
        raise ArgosError(f"{path}: not a readable .argosmodel (a zip archive): {err}") from None
    except OSError as err:
        raise ArgosError(f"{path}: cannot unpack: {err.strerror or err}") from None
    folder = os.path.join(into, top)
    if not os.path.isdir(folder):
        raise ArgosError(f"{path}: its top-level entry {top!r} is not a folder")
    return folder


# -- the folder -------------------------------------------------------------------------------
def read_metadata(folder: str, where: str) -> dict:
    """metadata.json, checked: a translate package from one language to another, without a
    target prefix (which onmt_lite does not force)."""
    path = os.path.join(folder, "metadata.json")
    name = f"{where} (metadata.json)" if where != folder else path
    if not os.path.isfile(path):
        raise ArgosError(f"{name}: missing: an Argos Translate package holds metadata.json")
    try:
        with open(path, encoding="utf-8") as f:
            metadata = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ArgosError(f"{name}: not valid JSON ({err})") from None
    if not isinstance(metadata, dict):
        raise ArgosError(f"{name}: expected a JSON object")
    if metadata.get("type", "translate") != "translate":
        raise ArgosError(f"{name}: type {metadata['type']!r}; only translate packages are read")
    for key in ("from_code", "to_code"):
        if not isinstance(metadata.get(key), str) or not metadata[key]:
            raise ArgosError(f"{name}: lacks {key} (the package's languages)")
    if metadata.get("target_prefix"):
        raise ArgosError(f"{name}: target_prefix {metadata['target_prefix']!r} is not supported")
    return metadata


def _read_folder(folder: str, where: str) -> dict:
    metadata = read_metadata(folder, where)
    spm_path = os.path.join(folder, "sentencepiece.model")
    if not os.path.isfile(spm_path):
        what = "a BPE package (bpe.model)" if os.path.isfile(os.path.join(folder, "bpe.model")) \
            else "no sentencepiece.model"
        raise ArgosError(f"{where}: {what}: onmt_lite reads packages with a sentencepiece model")
    model = os.path.join(folder, "model")
    if not os.path.isfile(os.path.join(model, "model.bin")):
        raise ArgosError(f"{where}: no model/model.bin (the package's CTranslate2 model)")
    from onmt_lite import ct2_model  # torch: a server finds its packages without it
    try:
        fields = ct2_model.read_ct2(model)
    except ct2_model.CT2Error as err:
        message = str(err)
        if where != folder:  # a temporary folder: name the package and the member instead
            message = message.replace(folder, f"{where} ({os.path.basename(folder)})")
        raise ct2_model.CT2Error(message) from None
    with open(spm_path, "rb") as f:
        spm = f.read()
    fields.update(origin="argos", tokenizer={
        "kind": "argos", "sentencepiece": spm, "from_code": metadata["from_code"],
        "to_code": metadata["to_code"], "absent": fields["tokenizer"]["absent"],
        "add_source_bos": fields["tokenizer"]["add_source_bos"],
        "add_source_eos": fields["tokenizer"]["add_source_eos"]})
    return fields


def read_package(path: str) -> dict:
    """An Argos Translate package (folder or .argosmodel) -> the fields of a Checkpoint."""
    if os.path.isdir(path):
        return _read_folder(path, path)
    with tempfile.TemporaryDirectory(prefix="onmt_lite-argos-") as into:
        return _read_folder(_unpack(path, into), path)


# -- text in and out, decoding defaults -------------------------------------------------------
class ArgosTokenizer:
    """Raw text <-> pieces as argos-translate-lt's SentencePieceTokenizer and
    apply_packaged_translation make them (see the module docstring)."""

    def __init__(self, files: dict, where: str):
        self.name = f"{where} (sentencepiece.model)"
        try:
            self.model = sentencepiece.SentencePieceProcessor(model_proto=files["sentencepiece"])
        except (RuntimeError, TypeError) as err:
            raise ArgosError(f"{self.name}: not a sentencepiece model "
                             f"({str(err).strip().splitlines()[0][:200]})") from None
        self.bos = "<s>" if files.get("add_source_bos") else None
        self.eos = "</s>" if files.get("add_source_eos") else None

    def pieces(self, side: str):
        """(model file, its ordinary pieces): what the model's vocabulary should hold."""
        return self.name, sentencepiece_pieces(self.model)

    def encode(self, line: str, side: str = "src") -> List[str]:
        pieces = self.model.encode(line, out_type=str)
        if side != "src" or not pieces:
            return pieces
        return [self.bos] * bool(self.bos) + pieces + [self.eos] * bool(self.eos)

    def decode(self, pieces: Sequence[str]) -> str:
        text = self.model.decode_pieces(list(pieces)).replace("\u2581", " ").replace("_", " ")
        return text[1:] if text.startswith(" ") else text


def decoding_defaults(given: set) -> dict:
    """argos's translate_batch arguments (DEFAULTS) for the options not in ``given``."""
    return {name: value for name, value in DEFAULTS if name not in given}


def describe(applied: dict) -> str:
    return ", ".join(f"-{name}" if value is True else f"-{name} {value}"
                     for name, value in applied.items())
