"""build_translator: a Translator from checkpoints (native, OpenNMT-py 3.x, Marian directories;
several: an ensemble), with each model family's defaults, the device, and -compile's warm-up."""
import logging
from typing import List, Optional

import torch

from onmt_lite import argos, ct2_model, marian
from onmt_lite.checkpoint import CheckpointError, load_model
from onmt_lite.errors import OptionError
from onmt_lite.models import aot
from onmt_lite.models.ensemble import EnsembleModel
from onmt_lite.models.inference import for_inference, uncompile
from onmt_lite.search.presets import PRESETS
from onmt_lite.transforms import TransformError, TransformOptionError, build_transform
from onmt_lite.translate.distributed import local_rank, world
from onmt_lite.translate.options import DecodingOptions, check_numbers
from onmt_lite.translate.translator import Translator

logger = logging.getLogger("onmt_lite")


def build_translator(opt) -> Translator:
    """Loads ``opt.model`` (native or OpenNMT-py 3.x checkpoint, or Marian directory) and
    returns a Translator.

    ``opt`` is a dict or a namespace with ``model``, ``gpu``, ``int8``, ``precision``,
    ``inter_threads`` and any DecodingOptions field. A model's generation defaults (Marian)
    apply to the options the user did not give: a dict's keys, or a namespace's
    ``given_options``. ``compile_stored_int8`` (the server's): a model stored in int8 that
    decodes on its int8 default on the CPU also decodes through compiled programs, as
    -compile, where a C++ compiler is found. The translator's ``compiles`` says whether it
    was to.
    """
    paths = _get(opt, "model")
    paths = [paths] if isinstance(paths, str) else list(paths)
    fields = DecodingOptions.__dataclass_fields__
    values = {name: _get(opt, name) for name in fields if _get(opt, name) is not None}
    _check_options(opt, values, len(paths))
    device = _device(_get(opt, "gpu", -1))
    threads = torch.get_num_threads()
    # loading on one torch thread: its few parallel operations (weight initialisation before
    # the checkpoint's weights replace it, conversions) gain little from more, and an OpenMP
    # team on a busy CPU waits for its descheduled threads (18% of a one-line run's time)
    torch.set_num_threads(1)
    try:
        models, src_vocab, tgt_vocab, values, transform, compile_ = _load(
            opt, paths, values, device)
    finally:
        torch.set_num_threads(threads)
    max_src = _position_limits(models, values)
    model = models[0] if len(models) == 1 else EnsembleModel(
        models, bool(_get(opt, "avg_raw_probs", False)))
    options = DecodingOptions(**values)
    inter_threads = _get(opt, "inter_threads")
    workers = _get(opt, "workers") or 1
    translator = Translator(model, src_vocab, tgt_vocab, options, device, max_src,
                            1 if inter_threads is None else inter_threads, transform, workers)
    translator.compiles = compile_
    if compile_:
        _compile_or_not(translator, models, device)
    return translator


def _get(opt, name, default=None):
    return opt.get(name, default) if isinstance(opt, dict) else getattr(opt, name, default)


def _check_options(opt, values: dict, models: int) -> None:
    """Refuses, before any model loads, the numbers out of range among the options given and
    the combinations build_translator cannot serve (OptionError)."""
    check_numbers({**values, **{name: _get(opt, name) for name in ("gpu", "threads",
                                                                    "inter_threads", "workers")
                                if _get(opt, name) is not None}})
    if models > 1 and values.get("search", "onmt") != "onmt":
        raise OptionError("-model: an ensemble decodes with -search onmt only")
    if (_get(opt, "workers") or 1) > 1 and (_get(opt, "threads") or 1) != 1:
        raise OptionError("-workers runs one torch thread per process: give -threads 1 (or 0)")


def _device(gpu: Optional[int]) -> str:
    """"cpu" for gpu -1 (or None), else "cuda:N" (under torchrun N is the local rank); refuses
    a GPU this machine does not have."""
    if gpu is None or gpu < 0:
        return "cpu"
    if world()[1] > 1:  # torchrun: each worker on its local rank's GPU
        gpu = local_rank()
    if not torch.cuda.is_available():
        why = ("this torch build has no CUDA support" if torch.version.cuda is None
               else "no CUDA device is visible")
        raise ValueError(f"-gpu {gpu}: {why} (-gpu -1 translates on the CPU)")
    count = torch.cuda.device_count()
    if gpu >= count:
        raise ValueError(f"-gpu {gpu}: this machine has {count} GPU(s), ids 0 to {count - 1}")
    return f"cuda:{gpu}"


# -- loading ------------------------------------------------------------------------------------
def _load(opt, paths: List[str], values: dict, device: str):
    """The models of ``paths`` ready for inference, their vocabularies, the decoding values
    with the search's and the model's defaults, and the transform."""
    path = paths[0]
    model, ckpt = load_model(path, device)
    src_vocab, tgt_vocab = ckpt.src_vocab, ckpt.tgt_vocab
    given = _given(opt)
    kind = ckpt.tokenizer.get("kind")
    applied = {}
    if kind == "argos":  # its search first: that search's own defaults fill the rest
        applied = argos.decoding_defaults(given)
        values.update(applied)
        if applied.get("replace_unk"):  # it reads the attention, which the caller may not keep
            values["keep_attention"] = True
        if applied:
            logger.info("the package's decoding defaults apply (Argos Translate's): %s",
                        argos.describe(applied))
    _search_defaults(values, given | set(applied))
    if kind in ("ctranslate2", "argos"):
        transform = _ct2_transform(opt, ckpt, path)
        _check_pieces_fit(transform, src_vocab, tgt_vocab)
        values["banned_tokens"] = sorted(set(values.get("banned_tokens") or ())
                                         | set(ckpt.tokenizer["absent"]))
    elif kind == "marian":
        if _get(opt, "transforms"):
            raise TransformOptionError("-transforms: a Marian model brings its own tokenizer "
                                       "(source.spm, target.spm, vocab.json)")
        transform = marian.build_tokenizer(ckpt.tokenizer, path)
        _check_pieces_fit(transform, src_vocab, tgt_vocab)
        values.update(_marian_defaults(ckpt, given, values, path))
    else:
        transform = build_transform(lambda name: _get(opt, name), ckpt.opt, path,
                                    ckpt.subword_models)
        _check_pieces_fit(transform, src_vocab, tgt_vocab)
    stored_int8 = bool(ckpt.int8_weights)
    del ckpt  # its weights are in the model now: free them before quantising, not after
    models = [model] + [_ensemble_member(other, device, src_vocab, tgt_vocab, path)
                        for other in paths[1:]]
    int8, fast = bool(_get(opt, "int8", False)), bool(_get(opt, "fast"))
    compile_ = bool(_get(opt, "compile"))
    if stored_int8 and "precision" not in given and not int8:
        int8 = fast = True
        # the server's default (compile_stored_int8): its steps of a few rows through a
        # program, a lone request answered in 0.69 of the time, larger ones level (serving.md)
        compile_ = compile_ or bool(_get(opt, "compile_stored_int8")) and device == "cpu" \
            and aot.compiler_problem() is None
        logger.info("%s is stored in int8: it decodes on the fast path%s with its own int8 "
                    "weights (-precision fp32: its weights dequantized, decoded exactly)", path,
                    ", compiled," if compile_ else "")
    models = [for_inference(m, device, int8, _get(opt, "precision", "auto") or "auto", fast,
                            compile_, _get(opt, "compile_cache", "") or "",
                            _get(opt, "int8_engine", "auto") or "auto", int8_rows=stored_int8,
                            build_programs=not _get(opt, "compile_if_cached", False))
              for m in models]
    return models, src_vocab, tgt_vocab, values, transform, compile_


def _ct2_transform(opt, ckpt, path: str):
    """A CTranslate2 model's text handling: an Argos package's sentencepiece model, or the
    plain model's whitespace-split tokens (with the <s> and </s> its config adds; None:
    nothing added)."""
    if _get(opt, "transforms"):
        raise TransformOptionError(f"-transforms: {path} reads "
                                   + ("raw text through its own sentencepiece model"
                                      if ckpt.origin == "argos" else
                                      "tokens as its vocabulary holds them"))
    files = ckpt.tokenizer
    if files["kind"] == "argos":
        try:
            return argos.ArgosTokenizer(files, path)
        except argos.ArgosError as err:
            raise CheckpointError(str(err)) from None
    bos = ckpt.src_vocab.specials["bos"] if files["add_source_bos"] else None
    eos = ckpt.src_vocab.specials["eos"] if files["add_source_eos"] else None
    return ct2_model.SourceMarks(bos, eos) if bos or eos else None


def _given(opt) -> set:
    """The options the user gave: a dict's keys, or a namespace's ``given_options``."""
    given = _get(opt, "given_options")
    return set(opt) if given is None and isinstance(opt, dict) else set(given or ())


def _ensemble_member(path: str, device: str, src_vocab, tgt_vocab, first: str):
    """Another model of an ensemble: it must read and write the first one's vocabularies."""
    model, ckpt = load_model(path, device)
    if ckpt.tokenizer.get("kind") == "marian":
        raise CheckpointError(f"{path}: a Marian model cannot join an ensemble")
    if ckpt.src_vocab.itos != src_vocab.itos or ckpt.tgt_vocab.itos != tgt_vocab.itos:
        raise CheckpointError(f"{path}: its vocabularies differ from those of {first}: the "
                              "models of an ensemble share one vocabulary")
    return model


FITTING_SHARE = 0.5  # of a subword model's pieces that the model's vocabulary must hold


def _check_pieces_fit(transform, src_vocab, tgt_vocab) -> None:
    """Refuses a subword model made for another model: most of its pieces would be unknown."""
    if not hasattr(transform, "pieces"):
        return
    for side, vocab in (("src", src_vocab), ("tgt", tgt_vocab)):
        path, pieces = transform.pieces(side)
        known = sum(piece in vocab.stoi for piece in pieces)
        if pieces and known < FITTING_SHARE * len(pieces):
            hint = "" if isinstance(transform, marian.MarianTokenizer) else \
                f" (wrong -{side}_subword_model?)"
            raise TransformError(f"{path}: does not fit the model's vocabulary: {known} of "
                                 f"its {len(pieces)} pieces are in it{hint}")


# -- each search's and model family's defaults --------------------------------------------------
def _search_defaults(values: dict, given: set) -> None:
    """The chosen search's own defaults (search/presets.py) into ``values``, where the user
    gave none."""
    preset = PRESETS.get(values.get("search", "onmt"))  # an unknown one: refused by validate
    for name, value in preset.defaults if preset else ():
        if name not in given:  # the toolkit's own default, not onmt_lite's
            values[name] = value


def _marian_defaults(ckpt, given: set, values: dict, path: str) -> dict:
    """The DecodingOptions values a Marian model's generation settings give where the user
    gave none, as ``generate()`` applies them."""
    search = values.get("search", DecodingOptions.search)
    if search == "ctranslate2":  # as CTranslate2 runs the model its converter makes of it:
        # no generation settings, and <pad> left out of the vocabulary
        return {"forced_eos": False, "banned_tokens": [ckpt.tgt_vocab.pad]}
    try:
        settings, banned, forced = marian.decoding_settings(
            ckpt.generation, ckpt.tgt_vocab, search)
    except marian.MarianError as err:
        raise CheckpointError(f"{path}: {err}") from None
    settings = {k: v for k, v in settings.items() if k not in given}
    if "max_length_ratio" not in given:  # generate() has no limit from the source length
        settings["max_length_ratio"] = 0.0
    beam_size = settings.get("beam_size", values.get("beam_size", DecodingOptions.beam_size))
    onmt = values.get("search", DecodingOptions.search) == "onmt"
    if onmt and "length_penalty" not in given and beam_size == 1:  # sums, as generate()
        settings["length_penalty"] = "none"
    settings["forced_eos"] = forced
    settings["banned_tokens"] = banned
    applied = marian.describe({k: v for k, v in settings.items()
                               if k not in ("max_length_ratio", "forced_eos", "banned_tokens")},
                              banned, forced, ckpt.tgt_vocab)
    if applied:
        logger.info("the model's generation defaults apply: %s", applied)
    return settings


def _position_limits(models: list, values: dict) -> Optional[int]:
    """A Transformer's position tables: the longest source the models read (None: no limit),
    and -max_length cut in ``values`` to what the decoder's table allows."""
    max_src = None  # the shortest position table of the models, if any has one
    for m in models:
        limit = getattr(getattr(m.encoder, "embeddings", None), "max_len", None)
        if limit is not None:  # a Transformer: the decoder's first input takes position 0
            max_src = min(max_src or limit, limit)
            values["max_length"] = min(values.get("max_length", DecodingOptions.max_length),
                                       m.decoder.embeddings.max_len - 1)
    return max_src


def _compile_or_not(translator: Translator, models: list, device: str) -> None:
    """-compile: builds (or loads) the model's programs at load (warm_up), on one thread: no
    OpenMP team is started before a fork (compiled_step.py). Where torch cannot export or
    compile them, one line says why and the model runs uncompiled."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        translator.warm_up()
    except Exception as err:  # noqa: BLE001 - any failure of export or compiler: run uncompiled
        if isinstance(err, aot.NotInCache):  # the server's first build: built beside it
            logger.info("-compile: %s: the model runs uncompiled", err)
        else:
            why = next((line for line in str(err).splitlines() if line.strip()), "")
            logger.warning("-compile: torch could not compile the model's programs on %s (%s: "
                           "%s): they run uncompiled", device, type(err).__name__,
                           why.strip()[:200])
        for model in models:
            uncompile(model)
    finally:
        torch.set_num_threads(threads)
