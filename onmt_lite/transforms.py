"""Subword transforms at translation time, with OpenNMT-py 3.5.1's names and meaning: raw text
is split into the model's pieces before translation and the pieces are joined back after.

Only ``sentencepiece`` is implemented; ``filtertoolong`` is accepted and does nothing here
(OpenNMT-py drops long lines, onmt_lite writes one line per input line).
"""
import logging
import os
from typing import Any, Callable, List, Optional, Sequence

import sentencepiece

from onmt_lite.constants import EOS

logger = logging.getLogger("onmt_lite")

SUPPORTED = ("sentencepiece", "filtertoolong")
OPTIONS = ("transforms", "src_subword_model", "tgt_subword_model")  # kept in checkpoints
NEWLINE = "\uff5fnewline\uff60"  # OpenNMT-py's stand-in for a newline inside a line: ｟newline｠


class TransformError(ValueError):
    """A transform that cannot be set up; the message names the file or option."""


def _load(path: str, option: str) -> sentencepiece.SentencePieceProcessor:
    if not os.path.isfile(path):
        raise TransformError(f"{path}: no such sentencepiece model (given by {option})")
    try:
        return sentencepiece.SentencePieceProcessor(model_file=path)
    except (OSError, RuntimeError) as err:
        raise TransformError(f"{path}: not a sentencepiece model ({option}): "
                             f"{str(err).strip().splitlines()[0][:200]}") from None


class SentencePieceTransform:
    """Raw text <-> sentencepiece pieces, as OpenNMT-py's ``sentencepiece`` transform does it."""

    def __init__(self, src_model: str, tgt_model: str):
        self.src = _load(src_model, "-src_subword_model")
        self.tgt = _load(tgt_model, "-tgt_subword_model")

    def encode(self, line: str, side: str = "src") -> List[str]:
        """Pieces of a raw line; a literal ``</s>`` inside the line stays one token."""
        model = self.src if side == "src" else self.tgt
        pieces: List[str] = []
        for i, chunk in enumerate(line.strip().replace(NEWLINE, "\n").split(EOS)):
            if i:
                pieces.append(EOS)
            pieces.extend(model.encode(chunk, out_type=str))
        return pieces

    def decode(self, pieces: Sequence[str]) -> str:
        """The raw text of target pieces (spm's own decoding: ``▁`` becomes a space)."""
        return self.tgt.decode_pieces(list(pieces)).replace("\n", NEWLINE)


def _resolve(path: str, checkpoint: str) -> str:
    """A subword model path named in a checkpoint: under the checkpoint's folder, or its file
    name there (a model shipped beside its checkpoint), else the path as it is."""
    folder = os.path.dirname(os.path.abspath(checkpoint))
    for candidate in (os.path.join(folder, path), os.path.join(folder, os.path.basename(path))):
        if path and os.path.isfile(candidate):
            return candidate
    return path


def build_transform(option: Callable[[str], Any], checkpoint_opt: dict,
                    checkpoint: str) -> Optional[SentencePieceTransform]:
    """The transform the options ask for (``option(name)`` gives the value of ``-name``, None
    when not given), or (given none) the one the checkpoint was trained with, when it names
    one; None for whitespace-split text."""
    transforms = option("transforms")
    if transforms is None:  # not given: the checkpoint's, with its model files
        transforms = checkpoint_opt.get("transforms") or []
        if "sentencepiece" not in transforms:
            return None
        src = option("src_subword_model") or _resolve(
            checkpoint_opt.get("src_subword_model") or "", checkpoint)
        tgt = option("tgt_subword_model") or _resolve(
            checkpoint_opt.get("tgt_subword_model") or "", checkpoint)
        logger.info("applying the checkpoint's transforms %s (source model %s, target model %s)",
                    list(transforms), src, tgt)
    else:
        src, tgt = option("src_subword_model"), option("tgt_subword_model")
    unknown = [name for name in transforms if name not in SUPPORTED]
    if unknown:
        raise TransformError(f"-transforms: {', '.join(unknown)} not supported (supported: "
                             f"{', '.join(SUPPORTED)})")
    if "sentencepiece" not in transforms:
        return None
    for path, name in ((src, "-src_subword_model"), (tgt, "-tgt_subword_model")):
        if not path:
            raise TransformError(f"-transforms sentencepiece needs {name}")
    return SentencePieceTransform(src, tgt)
