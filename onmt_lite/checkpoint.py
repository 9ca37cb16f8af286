"""Saving and loading checkpoints: the only place files become models.

A native checkpoint is one ``.pt`` file of plain containers: ``{"format": "onmt_lite",
"version": 1, "opt": dict, "vocab": {"src": [...], "tgt": [...]}, "model": state dict,
"generator": state dict}`` (plus ``"train"`` with the optimizer state while training; for a
converted Marian model, ``"vocab"`` names its ``"specials"``, ``"generation"`` holds its
generation defaults and ``"tokenizer"`` its sentencepiece models, see marian.py; for a model over
subword pieces, ``"subword_models"`` keeps the files its transform reads, by option name, so
that the checkpoint alone translates raw text).
Files are always read with ``torch.load(weights_only=True)``: nothing inside can run code.
"""
import argparse
import os
import pickle
import tempfile
from dataclasses import dataclass, field
from typing import Optional

import torch

from onmt_lite import argos, ct2_format, ct2_model, marian, onmt_py, transforms
from onmt_lite.errors import CheckpointError
from onmt_lite.models.model import NMTModel, build_model, model_options
from onmt_lite.vocab import DEFAULT_SPECIALS, Vocab

FORMAT, VERSION = "onmt_lite", 1


@dataclass
class Checkpoint:
    opt: dict
    src_vocab: Vocab
    tgt_vocab: Vocab
    model_state: dict
    generator_state: dict
    train_state: dict = field(default_factory=dict)
    origin: str = FORMAT  # "onmt_lite", "opennmt-py", "marian", "ctranslate2" or "argos"
    generation: dict = field(default_factory=dict)  # Hugging Face generation defaults
    tokenizer: dict = field(default_factory=dict)  # a Marian tokenizer's files (marian.py)
    # the subword model files of the transform: {"src_subword_model": bytes, ...}
    subword_models: dict = field(default_factory=dict)
    # CTranslate2 models (ct2_model.py): each side's position table, {"encoder": (P, H), ...},
    # which replaces the computed one; the int8 weights as stored, {name: (int8, scale)}
    position_tables: dict = field(default_factory=dict)
    int8_weights: dict = field(default_factory=dict)


def _as_tensor(data: bytes) -> torch.Tensor:
    """A file's bytes as a uint8 tensor: torch.save writes it as is, where bytes grow by a
    third (protocol 2 pickles them as text) and later protocols fail weights_only loading."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else \
        torch.empty(0, dtype=torch.uint8)


def save_checkpoint(path: str, model: NMTModel, src_vocab: Vocab, tgt_vocab: Vocab, opt: dict,
                    half: bool = False, train_state: Optional[dict] = None,
                    generation: Optional[dict] = None, tokenizer: Optional[dict] = None,
                    subword_models: Optional[dict] = None) -> None:
    """Writes a native checkpoint atomically (temporary file, then rename). ``subword_models``
    ({"src_subword_model": bytes, ...}) are the files of the transform named in ``opt``."""
    copies = {}  # tied weights (one embedding for source, target and output) are stored once

    def plain(state):
        out = {}
        for k, v in state.items():
            key = (v.data_ptr(), v.dtype, v.shape, v.stride())
            if key not in copies:
                copies[key] = (v.half() if half and v.is_floating_point() else v
                               ).detach().cpu().clone()
            out[k] = copies[key]
        return out
    transform_options = {k: opt[k] for k in transforms.OPTIONS if opt.get(k)}
    payload = {
        "format": FORMAT, "version": VERSION, "opt": {**model_options(opt), **transform_options},
        "vocab": {"src": list(src_vocab.itos), "tgt": list(tgt_vocab.itos)},
        "model": plain({k: v for k, v in model.state_dict().items()
                        if not k.startswith("generator.")}),
        "generator": plain(model.generator.state_dict()),
    }
    if tgt_vocab.specials != DEFAULT_SPECIALS:  # a Marian model's
        payload["vocab"]["specials"] = dict(tgt_vocab.specials)
    if subword_models:
        stored = {}  # one file named for both sides (a joint model) is stored once
        for data in subword_models.values():
            if data not in stored:
                stored[data] = _as_tensor(data)
        payload["subword_models"] = {name: stored[data] for name, data in subword_models.items()}
    for key, value in (("train", train_state), ("generation", generation),
                       ("tokenizer", tokenizer)):
        if value:
            payload[key] = value
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".pt")
    os.close(fd)
    try:
        torch.save(payload, tmp)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else type(err).__name__


TORCH_MAGIC = (b"PK\x03\x04", b"\x80")  # torch.save's zip archive; the legacy pickle format


def _what_it_is(head: bytes) -> str:
    """What a file holds, from its first bytes, for error messages."""
    if not head:
        return "an empty file"
    if head.startswith(TORCH_MAGIC):
        return "a truncated or corrupt torch file"
    if head[8:10] == b'{"':  # 8-byte header size, then a JSON header
        return "a safetensors file (weights without the model's options and vocabularies)"
    try:
        head.decode("utf-8")
        return "a text file"
    except UnicodeDecodeError as err:
        return "a text file" if err.start > len(head) - 4 else "a binary file of unknown format"


def _not_a_checkpoint(path: str, head: bytes, detail: str = "") -> CheckpointError:
    return CheckpointError(f"{path}: not a checkpoint: {_what_it_is(head)}, where a torch .pt "
                           f"file was expected{detail}")


def _read(path: str) -> dict:
    if os.path.isdir(path):
        raise CheckpointError(f"{path}: is a directory; expected a checkpoint file (.pt), a "
                              "Hugging Face Marian directory (with config.json), a CTranslate2 "
                              "model directory (with model.bin) or an Argos Translate package "
                              "(with metadata.json)")
    if not os.path.exists(path):
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError as err:
        raise CheckpointError(f"{path}: cannot read: {err.strerror}") from None
    if not head.startswith(TORCH_MAGIC):
        raise _not_a_checkpoint(path, head)
    try:
        # argparse.Namespace is the one class allowed: OpenNMT-py stores its options in one.
        with torch.serialization.safe_globals([argparse.Namespace]):
            data = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        blocked = [line for line in lines if "unsupported" in line.lower()]
        if not blocked:
            raise CheckpointError(f"{path}: not a readable checkpoint ({_first_line(err)})") from None
        raise CheckpointError(f"{path}: refused, the file holds more than plain data "
                              f"({blocked[0]})") from None
    except Exception as err:  # torch raises many kinds on truncated or foreign files
        raise _not_a_checkpoint(path, head, f" ({_first_line(err).split('. ')[0]})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: not a checkpoint (a {type(data).__name__}, not a dict)")
    return data


def load_checkpoint(path: str) -> Checkpoint:
    """Reads and validates a native or OpenNMT-py 3.x checkpoint, a Hugging Face Marian
    directory, a CTranslate2 model directory or an Argos Translate package (folder or
    .argosmodel)."""
    if argos.is_package(path):
        try:
            return Checkpoint(**argos.read_package(path))
        except (argos.ArgosError, ct2_model.CT2Error) as err:
            raise CheckpointError(str(err)) from None
    if ct2_format.is_model_dir(path):  # before Marian: both hold a config.json
        try:
            return Checkpoint(**ct2_model.read_ct2(path))
        except ct2_model.CT2Error as err:
            raise CheckpointError(str(err)) from None
    if marian.is_marian_dir(path):
        try:
            return Checkpoint(**marian.read_marian(path))
        except marian.MarianError as err:
            raise CheckpointError(str(err)) from None
    data = _read(path)
    if "format" not in data and onmt_py.is_onmt_py(data):
        try:
            return Checkpoint(*onmt_py.convert(data), origin="opennmt-py")
        except (ValueError, KeyError, TypeError) as err:
            raise CheckpointError(f"{path}: {err}") from None
    if data.get("format") != FORMAT:
        raise CheckpointError(f"{path}: unknown checkpoint format {data.get('format')!r}")
    if data.get("version") != VERSION:
        raise CheckpointError(f"{path}: unsupported {FORMAT} checkpoint version "
                              f"{data.get('version')!r} (this is version {VERSION})")
    for key, kind in (("opt", dict), ("vocab", dict), ("model", dict), ("generator", dict)):
        if not isinstance(data.get(key), kind):
            raise CheckpointError(f"{path}: missing or malformed {key!r}")
    try:
        specials = data["vocab"].get("specials")
        vocabs = [Vocab(data["vocab"][side], specials) for side in ("src", "tgt")]
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"{path}: bad vocabulary: {err}") from None
    return Checkpoint(data["opt"], vocabs[0], vocabs[1], data["model"], data["generator"],
                      data.get("train", {}), generation=data.get("generation", {}),
                      tokenizer=data.get("tokenizer", {}),
                      subword_models=_subword_models(data.get("subword_models", {}), path))


def _subword_models(stored, path: str) -> dict:
    """The kept subword model files as bytes, by option name."""
    if not (isinstance(stored, dict) and all(
            isinstance(v, torch.Tensor) and v.dtype == torch.uint8 and v.dim() == 1
            for v in stored.values())):
        raise CheckpointError(f"{path}: malformed 'subword_models' (expected files as uint8 "
                              "tensors by option name)")
    return {name: data.numpy().tobytes() for name, data in stored.items()}


def build_from_checkpoint(ckpt: Checkpoint, path: str = "checkpoint") -> NMTModel:
    """Builds the model of ``ckpt`` with its weights in fp32; refuses weights that do not fit."""
    try:
        model = build_model(ckpt.opt, len(ckpt.src_vocab), len(ckpt.tgt_vocab),
                            ckpt.src_vocab.pad, ckpt.tgt_vocab.pad)
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{path}: bad model options: {err}") from None
    state = dict(ckpt.model_state)
    state.update({f"generator.{k}": v for k, v in ckpt.generator_state.items()})
    for name, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise CheckpointError(f"{path}: weight {name} is a {type(value).__name__}, not a tensor")
    state = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"{path}: weights do not fit the model options "
                              f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    for name, tensor in expected.items():
        if state[name].shape != tensor.shape:
            raise CheckpointError(
                f"{path}: {name} has shape {tuple(state[name].shape)}, the model options and "
                f"vocabularies need {tuple(tensor.shape)}")
    for name, value in state.items():
        # one nan or inf spreads through every score: the output would be garbage
        if value.is_floating_point() and not torch.isfinite(value.sum()):
            bad = int(value.numel() - torch.isfinite(value).sum())
            if bad:  # else a sum of large finite values overflowed
                raise CheckpointError(f"{path}: weight {name} holds {bad} non-finite "
                                      f"value{'s' if bad > 1 else ''} (nan or inf): the model "
                                      "cannot translate")
    model.load_state_dict(state)
    _install_position_tables(model, ckpt.position_tables, path)
    return model


def _install_position_tables(model: NMTModel, tables: dict, path: str) -> None:
    """A CTranslate2 model's position tables in place of the computed ones."""
    for side, table in tables.items():
        embeddings = getattr(model, side).embeddings
        if table.shape != embeddings.pe.shape:
            raise CheckpointError(f"{path}: the {side}'s position table has shape "
                                  f"{tuple(table.shape)}, the model's {tuple(embeddings.pe.shape)}")
        embeddings.pe.copy_(table)


def load_model(path: str, device: str = "cpu"):
    """Loads a checkpoint and returns (model in eval mode, checkpoint)."""
    ckpt = load_checkpoint(path)
    model = build_from_checkpoint(ckpt, path).to(device).eval()
    return model, ckpt
