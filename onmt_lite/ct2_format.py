"""CTranslate2's ``model.bin``, read as data without the ``ctranslate2`` package.

The layout is the one ``ctranslate2/specs/model_spec.py`` (``ModelSpec._serialize``) writes
and ``src/models/model.cc`` reads, little-endian throughout:

    uint32 binary version (1 to 6)
    string spec name, uint32 spec revision          (version 2 and later)
    uint32 count, then per variable:
        string name, uint8 rank, uint32 x rank dims,
        uint8 dtype id, uint32 byte count             (version 4 and later)
        uint8 item size, uint32 element count         (before: 4 float32, 2 int16, 1 int8)
        the bytes
    uint32 count, then per alias: string alias, string target   (version 3 and later)

A string is a uint16 length that counts a closing NUL, the UTF-8 bytes, the NUL. Scalars
(rank 0) are the spec's attributes: flags as int8, numbers as int16/int32/float32.
"""
import os
import struct
from dataclasses import dataclass, field
from typing import Dict, Tuple

import torch

CURRENT_VERSION = 6  # what CTranslate2 4.x writes; 1 to 6 are read, as its loader reads them
DTYPES = {0: torch.float32, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.float16,
          5: torch.bfloat16}  # include/ctranslate2/types.h, DataType
ITEM_SIZES = {4: torch.float32, 2: torch.int16, 1: torch.int8}  # versions 1 to 3


class ModelBinError(ValueError):
    """A model.bin that cannot be read; the message names the file and the problem."""


@dataclass
class ModelBin:
    """The variables of one model.bin, aliases resolved to the same tensors."""
    path: str
    version: int
    spec: str
    revision: int
    variables: Dict[str, torch.Tensor]
    aliases: Dict[str, str] = field(default_factory=dict)

    def get(self, name: str):
        """The variable ``name`` (following an alias), or None."""
        return self.variables.get(self.aliases.get(name, name))

    def scalar(self, name: str, default=None):
        """A scalar attribute as a Python number, or ``default``."""
        value = self.get(name)
        return default if value is None else value.item()


class _Cursor:
    """Reads the file's fields in order; a short read names the file and the offset."""

    def __init__(self, data: bytearray, path: str):
        self.data, self.path, self.at = data, path, 0

    def take(self, size: int) -> int:
        start = self.at
        if start + size > len(self.data):
            raise ModelBinError(f"{self.path}: truncated: needs {size} bytes at offset {start}, "
                                f"the file has {len(self.data)}")
        self.at += size
        return start

    def unpack(self, fmt: str):
        start = self.take(struct.calcsize(fmt))
        return struct.unpack_from(fmt, self.data, start)[0]

    def string(self) -> str:
        length = self.unpack("<H")
        if length == 0:
            raise ModelBinError(f"{self.path}: a string of length 0 at offset {self.at - 2}")
        start = self.take(length)
        try:
            return bytes(self.data[start:start + length - 1]).decode("utf-8")
        except UnicodeDecodeError:
            raise ModelBinError(f"{self.path}: a name that is not UTF-8 at offset {start}"
                                ) from None


def _variable(cursor: _Cursor, version: int) -> Tuple[str, torch.Tensor]:
    name = cursor.string()
    rank = cursor.unpack("<B")
    shape = [cursor.unpack("<I") for _ in range(rank)]
    if version >= 4:
        type_id = cursor.unpack("<B")
        if type_id not in DTYPES:
            raise ModelBinError(f"{cursor.path}: variable {name} has the unknown type id "
                                f"{type_id}")
        dtype, size = DTYPES[type_id], cursor.unpack("<I")
    else:
        item = cursor.unpack("<B")
        if item not in ITEM_SIZES:
            raise ModelBinError(f"{cursor.path}: variable {name} has items of {item} bytes")
        dtype = ITEM_SIZES[item]
        size = cursor.unpack("<I") * item
    count = 1
    for dim in shape:
        count *= dim
    if size != count * dtype.itemsize:
        raise ModelBinError(f"{cursor.path}: variable {name} holds {size} bytes, its shape "
                            f"{tuple(shape)} of {dtype} needs {count * dtype.itemsize}")
    start = cursor.take(size)
    tensor = torch.frombuffer(cursor.data, dtype=dtype, count=count, offset=start) if count \
        else torch.empty(0, dtype=dtype)
    return name, tensor.reshape(shape).clone()  # its own memory, not the file's buffer


def read_model_bin(path: str) -> ModelBin:
    """Reads ``path`` (a CTranslate2 model.bin): its version, spec, variables and aliases.
    Refuses a version this reader does not know, naming the file."""
    try:
        with open(path, "rb") as f:
            data = bytearray(f.read())
    except OSError as err:
        raise ModelBinError(f"{path}: cannot read: {err.strerror}") from None
    cursor = _Cursor(data, path)
    version = cursor.unpack("<I")
    if not 1 <= version <= CURRENT_VERSION:
        raise ModelBinError(f"{path}: unknown CTranslate2 model.bin version {version} (this "
                            f"reader knows versions 1 to {CURRENT_VERSION})")
    spec, revision = (cursor.string(), cursor.unpack("<I")) if version >= 2 else ("", 1)
    variables = dict(_variable(cursor, version) for _ in range(cursor.unpack("<I")))
    aliases = {}
    if version >= 3:
        for _ in range(cursor.unpack("<I")):
            alias, target = cursor.string(), cursor.string()
            if target not in variables:
                raise ModelBinError(f"{path}: alias {alias} names no variable ({target})")
            aliases[alias] = target
            if target + "_scale" in variables:  # as the loader: a weight's scale follows it
                aliases[alias + "_scale"] = target + "_scale"
    if cursor.at != len(data):
        raise ModelBinError(f"{path}: {len(data) - cursor.at} bytes after the last alias")
    return ModelBin(path, version, spec, revision, variables, aliases)


def is_model_dir(path: str) -> bool:
    """A folder holding a CTranslate2 model (model.bin)."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "model.bin"))
