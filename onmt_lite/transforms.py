"""Subword transforms at translation time, with OpenNMT-py 3.5.1's names and meaning (its
onmt/transforms/tokenize.py): raw text is split into the model's pieces before translation and
the pieces are joined back after.

``sentencepiece`` (sentencepiece), ``onmt_tokenize`` (pyonmttok) and ``bpe`` (subword-nmt) are
implemented; ``filtertoolong`` is accepted and does nothing here (OpenNMT-py drops long lines,
onmt_lite writes one line per input line).
"""
import ast
import contextlib
import io
import logging
import os
import re
import tempfile
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence

import pyonmttok
import sentencepiece
from subword_nmt.apply_bpe import BPE

from onmt_lite.constants import EOS, PAD
from onmt_lite.errors import OptionError

logger = logging.getLogger("onmt_lite")

SUBWORD = ("sentencepiece", "onmt_tokenize", "bpe")
SUPPORTED = SUBWORD + ("filtertoolong",)
OPTIONS = ("transforms", "src_subword_model", "tgt_subword_model", "src_subword_type",
           "tgt_subword_type", "src_onmttok_kwargs", "tgt_onmttok_kwargs")  # kept in checkpoints
SUBWORD_TYPES = ("none", "sentencepiece", "bpe")  # -src_subword_type / -tgt_subword_type
DEFAULT_ONMTTOK_KWARGS = "{'mode': 'none'}"
NEWLINE = "\uff5fnewline\uff60"  # OpenNMT-py's stand-in for a newline inside a line: ｟newline｠
MASK_BEFORE = "\uff5f_mask_before_\uff60"  # OpenNMT-py's prompt marker ｟_mask_before_｠
Option = Callable[[str], Any]  # the value of -name, None when not given


class TransformError(ValueError):
    """A transform that cannot be set up; the message names the file or option."""


class TransformOptionError(TransformError, OptionError):
    """A transform option, or a combination, that is refused (exit 2, as other option errors)."""


class SubwordTransform:
    """What OpenNMT-py's subword transforms share: a raw line is cut at literal ``</s>`` and
    ``｟_mask_before_｠`` markers, each chunk is tokenized on its own, and the markers come back
    as the tokens ``</s>`` and ``<blank>``."""

    def encode(self, line: str, side: str = "src") -> List[str]:
        """The pieces of a raw line, by the ``side`` ("src" or "tgt") tokenizer."""
        pieces: List[str] = []
        for i, sentence in enumerate(line.strip().split(EOS)):
            if i:
                pieces.append(EOS)
            for j, chunk in enumerate(sentence.split(MASK_BEFORE)):
                if j:
                    pieces.append(PAD)
                pieces.extend(self.tokenize(chunk, side))
        return pieces

    def decode(self, pieces: Sequence[str]) -> str:
        """The raw text of target pieces."""
        # OpenNMT-py hands the transform the hypothesis as one line and splits it at spaces
        return self.detokenize(" ".join(pieces).split(" "))

    def tokenize(self, text: str, side: str) -> List[str]:
        """The pieces of one chunk of a line."""
        raise NotImplementedError

    def detokenize(self, tokens: List[str]) -> str:
        """The raw text of target tokens."""
        raise NotImplementedError


class Named(str):
    """A subword model path named in a checkpoint, not given on the command line: ``origin``
    says so in messages (and, for a file not found, where it was looked for)."""

    def __new__(cls, path: str, origin: str):
        named = super().__new__(cls, path)
        named.origin = origin
        return named


class Kept(NamedTuple):
    """A subword model file kept inside a checkpoint: its name in messages, and its bytes."""
    name: str  # "checkpoint (the file as the checkpoint names it)", as marian.py names files
    data: bytes
    origin = "kept in the checkpoint"

    def __repr__(self) -> str:  # messages show the name, never the bytes
        return self.name

    __str__ = __repr__


def _origin(model, option: str) -> str:
    """Where a subword model comes from: the option that gave it, or the checkpoint."""
    return getattr(model, "origin", option)


def _check_file(path: str, what: str, option: str) -> None:
    if not os.path.isfile(path):
        raise TransformError(f"{path}: no such {what} "
                             f"({getattr(path, 'origin', f'given by {option}')})")


def _load_sentencepiece(model, option: str) -> sentencepiece.SentencePieceProcessor:
    """The sentencepiece model of a path or of a Kept file."""
    processor = sentencepiece.SentencePieceProcessor()
    try:
        if isinstance(model, Kept):  # (model_proto=b"" would load nothing, and say nothing)
            processor.LoadFromSerializedProto(model.data)
        else:
            _check_file(model, "sentencepiece model", option)
            processor.Load(model_file=model)
    except (OSError, RuntimeError) as err:
        raise TransformError(f"{model}: not a sentencepiece model ({_origin(model, option)}): "
                             f"{str(err).strip().splitlines()[0][:200]}") from None
    return processor


def _load_bpe(model, option: str) -> BPE:
    """The BPE codes of a path or of a Kept file."""
    if not isinstance(model, Kept):
        _check_file(model, "BPE codes file", option)
    message = io.StringIO()
    try:
        codes = io.StringIO(model.data.decode("utf-8")) if isinstance(model, Kept) else \
            open(model, encoding="utf-8")
        with codes, contextlib.redirect_stderr(message):
            return BPE(codes=codes)
    except (ValueError, SystemExit) as err:  # subword-nmt exits on a malformed line, saying why
        why = (message.getvalue().strip() or str(err)).splitlines()[0]
        raise TransformError(f"{model}: not a subword-nmt BPE codes file "
                             f"({_origin(model, option)}): {why[:200]}") from None


def sentencepiece_pieces(model: sentencepiece.SentencePieceProcessor) -> List[str]:
    return [model.id_to_piece(i) for i in range(model.get_piece_size())
            if not (model.is_control(i) or model.is_unknown(i) or model.is_unused(i))]


class SentencePieceTransform(SubwordTransform):
    """Raw text <-> sentencepiece pieces, as OpenNMT-py's ``sentencepiece`` transform does it."""

    def __init__(self, src_model, tgt_model):
        """Each side's model: a file's path, or a Kept file."""
        self.paths = {"src": str(src_model), "tgt": str(tgt_model)}
        self.models = {"src": _load_sentencepiece(src_model, "-src_subword_model"),
                       "tgt": _load_sentencepiece(tgt_model, "-tgt_subword_model")}

    def pieces(self, side: str):
        """(model file, its ordinary pieces): what the model's vocabulary should hold."""
        return self.paths[side], sentencepiece_pieces(self.models[side])

    def tokenize(self, text: str, side: str) -> List[str]:
        return self.models[side].encode(text.replace(NEWLINE, "\n"), out_type=str)

    def detokenize(self, tokens: List[str]) -> str:
        """spm's own decoding: ``▁`` becomes a space."""
        return self.models["tgt"].decode_pieces(tokens).replace("\n", NEWLINE)


class BPETransform(SubwordTransform):
    """Raw text <-> subword-nmt BPE pieces (``@@`` ends a piece that a word continues), as
    OpenNMT-py's ``bpe`` transform does it."""

    def __init__(self, src_codes, tgt_codes):
        """Each side's codes: a file's path, or a Kept file."""
        self.models = {"src": _load_bpe(src_codes, "-src_subword_model"),
                       "tgt": _load_bpe(tgt_codes, "-tgt_subword_model")}

    def tokenize(self, text: str, side: str) -> List[str]:
        # words are what lies between ASCII spaces: a no-break space stays inside its word
        return self.models[side].segment_tokens(text.split(" "))

    def detokenize(self, tokens: List[str]) -> str:
        return re.sub(r"(@@ )|(@@ ?$)", "", " ".join(tokens))


class OnmtTokenizeTransform(SubwordTransform):
    """Raw text <-> pyonmttok tokens, as OpenNMT-py's ``onmt_tokenize`` transform does it.

    Args:
        src, tgt: the ``pyonmttok.Tokenizer`` arguments of each side.
        newline_to_break: give pyonmttok ``｟newline｠`` as a line break ("\\n").
    """

    def __init__(self, src: Dict[str, Any], tgt: Dict[str, Any], newline_to_break: bool):
        self.arguments = (src, tgt, newline_to_break)
        self.tokenizers = {"src": _tokenizer(src, "-src_onmttok_kwargs"),
                           "tgt": _tokenizer(tgt, "-tgt_onmttok_kwargs")}
        self.newline_to_break = newline_to_break

    def __reduce__(self):
        # pyonmttok's tokenizers do not pickle: made again from their arguments (the lanes of a
        # server and its own process each hold the model's transform)
        return type(self), self.arguments

    def tokenize(self, text: str, side: str) -> List[str]:
        if self.newline_to_break:
            text = text.replace(NEWLINE, "\n")
        return self.tokenizers[side](text)

    def detokenize(self, tokens: List[str]) -> str:
        return self.tokenizers["tgt"].detokenize(tokens).replace("\n", NEWLINE)

    @classmethod
    def from_options(cls, option: Option) -> "OnmtTokenizeTransform":
        src, tgt = _tokenizer_arguments(option, "src"), _tokenizer_arguments(option, "tgt")
        # OpenNMT-py 3.5.1 decides this for both sides, from the source type and target kwargs
        newline_to_break = (option("src_subword_type") == "sentencepiece"
                            and not tgt.get("preserve_placeholders", False))
        return cls(src, tgt, newline_to_break)


def _tokenizer(arguments: Dict[str, Any], option: str) -> pyonmttok.Tokenizer:
    with tempfile.TemporaryDirectory() as folder:
        try:
            return pyonmttok.Tokenizer(**_written(arguments, folder))
        except ValueError as err:  # an unknown mode, a model file pyonmttok cannot open
            why = str(err).strip().splitlines()[0][:200]
            raise TransformOptionError(f"{option}: {why}") from None
        except TypeError:  # names checked: a value of the wrong type (pybind11 says not which)
            raise TransformOptionError(f"{option}: pyonmttok.Tokenizer rejects a value of the "
                                       f"wrong type in {arguments}") from None


def _written(arguments: Dict[str, Any], folder: str) -> Dict[str, Any]:
    """``arguments`` with each Kept file written into ``folder``: pyonmttok reads model files
    by path only, once, when the tokenizer is made."""
    out = dict(arguments)
    for key, value in arguments.items():
        if isinstance(value, Kept):
            out[key] = os.path.join(folder, key)
            with open(out[key], "wb") as f:
                f.write(value.data)
    return out


def _tokenizer_argument_names() -> set:
    # pybind11 gives pyonmttok.Tokenizer no signature object; its docstring lists the arguments
    names = re.findall(r"(\w+):", pyonmttok.Tokenizer.__init__.__doc__ or "")
    return set(names) - {"self", "tokenizer"}


def _onmttok_kwargs(given: Any, option: str) -> Dict[str, Any]:
    """The dict of -src_onmttok_kwargs or -tgt_onmttok_kwargs: a dict (as OpenNMT-py keeps it
    in checkpoints) or its Python literal, read without eval; not given: OpenNMT-py's default."""
    given = DEFAULT_ONMTTOK_KWARGS if given is None else given
    kwargs = given
    if isinstance(given, str):  # literal_eval: a dict of plain values, never a call
        try:
            kwargs = ast.literal_eval(given)
        except (ValueError, TypeError, SyntaxError, RecursionError):
            kwargs = None
    if not isinstance(kwargs, dict):
        raise TransformOptionError(f"{option}: expected a Python dict such as \"{{'mode': "
                                   f"'aggressive', 'joiner_annotate': True}}\", got {given!r}")
    names = _tokenizer_argument_names()
    unknown = [key for key in kwargs if names and key not in names]
    if unknown:
        raise TransformOptionError(f"{option}: {unknown[0]!r} is not a pyonmttok.Tokenizer "
                                   "argument")
    if "mode" not in kwargs:
        raise TransformOptionError(f"{option}: pyonmttok needs a 'mode' (none, space, "
                                   f"conservative, aggressive or char), got {given!r}")
    return kwargs


def _tokenizer_arguments(option: Option, side: str) -> Dict[str, Any]:
    """One side's pyonmttok.Tokenizer arguments, merged as OpenNMT-py 3.5.1 merges them: the
    subword model under the name its type gives, with translation's defaults (no BPE dropout,
    no subword sampling), then the side's onmttok kwargs."""
    kind, model = option(f"{side}_subword_type") or "none", option(f"{side}_subword_model")
    if kind not in SUBWORD_TYPES:
        raise TransformOptionError(f"-{side}_subword_type: {kind!r} is not one of "
                                   f"{', '.join(SUBWORD_TYPES)}")
    if kind != "none" and not model:
        raise TransformOptionError(f"-{side}_subword_type {kind} needs -{side}_subword_model")
    subword: Dict[str, Any] = {}
    if kind == "bpe":
        _load_bpe(model, f"-{side}_subword_model")  # pyonmttok takes any file for BPE codes
        subword = {"bpe_model_path": model, "bpe_dropout": 0}
    elif kind == "sentencepiece":
        _load_sentencepiece(model, f"-{side}_subword_model")
        subword = {"sp_model_path": model, "sp_nbest_size": 1, "sp_alpha": 0}
    elif model:
        logger.warning("-%s_subword_model %s is not used: -%s_subword_type is none",
                       side, model, side)
    kwargs = _onmttok_kwargs(option(f"{side}_onmttok_kwargs"), f"-{side}_onmttok_kwargs")
    clash = [key for key in kwargs if key in subword]
    if clash:
        raise TransformOptionError(f"-{side}_onmttok_kwargs: {clash[0]!r} is set by "
                                   f"-{side}_subword_type and -{side}_subword_model")
    return {**subword, **kwargs}


def _model_files(option: Option, transform: str) -> List[str]:
    files = [option("src_subword_model"), option("tgt_subword_model")]
    for path, side in zip(files, ("src", "tgt")):
        if not path:
            raise TransformOptionError(f"-transforms {transform} needs -{side}_subword_model")
    return files


def resolve(path: str, checkpoint: str, name: str) -> str:
    """A subword model path that a checkpoint names as option ``name``: under the checkpoint's
    folder, or its file name there (a model shipped beside its checkpoint), else the path as it
    is; not found, a Named path whose origin says where it was looked for."""
    if not path:
        return path
    folder = os.path.dirname(os.path.abspath(checkpoint))
    places = [os.path.join(folder, path), os.path.join(folder, os.path.basename(path)), path]
    origin = f"named in the checkpoint {checkpoint}"
    for place in places:
        if os.path.isfile(place):
            return Named(place, origin)
    looked = ", ".join(dict.fromkeys(os.path.abspath(place) for place in places))
    return Named(path, f"{origin}, looked for at {looked}; give -{name}")


def _with_checkpoint_options(option: Option, checkpoint_opt: dict, checkpoint: str,
                             kept: Dict[str, bytes]) -> Option:
    """``option`` where given, else the checkpoint's value: its model files as kept in it,
    else as found by resolve."""
    def value(name: str):
        given = option(name)
        if given is not None:
            return given
        if name.endswith("_subword_model"):
            named = checkpoint_opt.get(name) or ""
            if name in kept:
                return Kept(f"{checkpoint} ({named})", kept[name])
            return resolve(named, checkpoint, name)
        return checkpoint_opt.get(name)
    return value


def build_transform(option: Option, checkpoint_opt: dict, checkpoint: str,
                    kept: Optional[Dict[str, bytes]] = None) -> Optional[SubwordTransform]:
    """The transform the options ask for (``option(name)`` gives the value of ``-name``, None
    when not given), or (given none) the one the checkpoint was trained with, when it names
    one, with the checkpoint's values of the options not given; None for whitespace-split text.
    ``kept``: the subword model files kept in the checkpoint, by option name."""
    transforms = option("transforms")
    if transforms is None:  # not given: the checkpoint's, with its model files
        transforms = checkpoint_opt.get("transforms") or []
        if not any(name in SUBWORD for name in transforms):
            return None
        option = _with_checkpoint_options(option, checkpoint_opt, checkpoint, kept or {})
        logger.info("applying the checkpoint's transforms %s (source model %s, target model %s)",
                    list(transforms), option("src_subword_model"), option("tgt_subword_model"))
    unknown = [name for name in transforms if name not in SUPPORTED]
    if unknown:
        raise TransformOptionError(f"-transforms: {', '.join(unknown)} not supported (supported: "
                                   f"{', '.join(SUPPORTED)})")
    subword = [name for name in transforms if name in SUBWORD]
    if len(subword) > 1:
        raise TransformOptionError(f"-transforms: one subword transform at a time, got "
                                   f"{', '.join(subword)}")
    if not subword:
        return None
    if subword[0] == "onmt_tokenize":
        return OnmtTokenizeTransform.from_options(option)
    files = _model_files(option, subword[0])
    return SentencePieceTransform(*files) if subword[0] == "sentencepiece" else BPETransform(*files)


def subword_model_files(opt: dict) -> Dict[str, str]:
    """The subword model files that the transform of ``opt`` reads, by option name
    ({"src_subword_model": path, ...}): what a checkpoint keeps."""
    subword = [name for name in opt.get("transforms") or [] if name in SUBWORD]
    sides = ("src", "tgt") if subword else ()
    if subword[:1] == ["onmt_tokenize"]:  # a subword model only where a side has its type
        sides = [side for side in sides if (opt.get(f"{side}_subword_type") or "none") != "none"]
    return {f"{side}_subword_model": opt[f"{side}_subword_model"] for side in sides
            if opt.get(f"{side}_subword_model")}


def read_subword_models(files: Dict[str, str]) -> Dict[str, bytes]:
    """The bytes of each file of subword_model_files, by option name, to keep in a checkpoint."""
    models = {}
    for name, path in files.items():
        try:
            with open(path, "rb") as f:
                models[name] = f.read()
        except OSError as err:
            raise TransformError(f"{path}: cannot read the subword model (-{name}): "
                                 f"{err.strerror}") from None
    return models
