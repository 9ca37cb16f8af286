"""What the server serves: one model from command-line options, or several from a conf.json in
OpenNMT-py's server format (``models_root``, ``models`` with ``id``, ``model``, ``timeout``,
``on_timeout``, ``load``, ``opt``, ``tokenizer``), plus ``src_lang`` / ``tgt_lang`` per model."""
import argparse
import json
import logging
import os
import re
import tempfile
import zipfile
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from onmt_lite import argos
from onmt_lite.errors import OptionError
from onmt_lite.options import config_value
from onmt_lite.translate.flags import build_parser

logger = logging.getLogger("onmt_lite")

# conf.json fields that name Python functions to import and run: refused, a conf is data
CODE_FIELDS = ("preprocess", "postprocess", "custom_opt")
# fields of OpenNMT-py's CTranslate2 and features paths, which this server does not have
UNSUPPORTED_FIELDS = ("ct2_model", "ct2_translator_args", "ct2_translate_batch_args", "features")
KNOWN_FIELDS = ("id", "model", "models", "model_root", "timeout", "on_timeout", "load", "opt",
                "tokenizer", "src_lang", "tgt_lang", "name")
# translate options a model's ``opt`` may not hold: they name files the server would read or
# write for the client, or the server's own threads
REFUSED_OPTIONS = ("src", "tgt", "output", "attn_dump", "attn_plot", "config", "phrase_table",
                   "log_file", "models", "model", "inter_threads", "workers", "threads")
# a folder of compiled code the server writes and loads (-compile): only the server's own
# command line names it; a conf.json or a client leaves -compile to its default folder
COMMAND_LINE_OPTIONS = ("compile_cache",)


@dataclass
class ModelSpec:
    """One served model: a checkpoint (or Marian folder) and its decoding options."""
    id: int
    path: str
    opt: dict = field(default_factory=dict)  # translate.py option values (names without -)
    src_lang: Optional[str] = None
    tgt_lang: Optional[str] = None
    timeout: float = -1  # seconds idle before on_timeout; -1: never
    on_timeout: str = "to_cpu"  # to_cpu (on CPU: nothing to do) or unload
    load: bool = True  # at start-up; False: at its first request
    tokenizer: Optional[dict] = None  # as given in conf.json, for GET /translator/models
    user_opt: dict = field(default_factory=dict)  # the conf's opt as given, for /models
    name: Optional[str] = None

    def describe(self) -> str:
        return f"model {self.id} ({os.path.basename(self.path.rstrip('/'))})"


class ConfError(OptionError):
    """A conf.json the server refuses; the message names the file and the field."""


def guess_languages(path: str):
    """(source, target) language codes from a Marian folder's name such as opus-mt-en-de."""
    match = re.search(r"(?:^|[-_])([a-z]{2,3})[-_]([a-z]{2,3})$", os.path.basename(path.rstrip("/")))
    return (match.group(1), match.group(2)) if match else (None, None)


def tokenizer_options(tokenizer: dict, root: str, where: str) -> dict:
    """OpenNMT-py's server ``tokenizer`` entry as translate.py transform options."""
    if "src" in tokenizer and "tgt" in tokenizer:
        sides = {"src": tokenizer["src"], "tgt": tokenizer["tgt"]}
    else:
        sides = {"src": tokenizer, "tgt": tokenizer}
    kinds = {side: entry.get("type") if isinstance(entry, dict) else None
             for side, entry in sides.items()}
    if kinds["src"] != kinds["tgt"]:
        raise ConfError(f"{where}: tokenizer: one type for both sides, got {kinds}")
    kind = kinds["src"]
    opt = {}
    if kind == "sentencepiece":
        opt["transforms"] = ["sentencepiece"]
        for side, entry in sides.items():
            if "model" not in entry:
                raise ConfError(f"{where}: tokenizer: a sentencepiece tokenizer needs 'model'")
            opt[f"{side}_subword_model"] = os.path.join(root, entry["model"])
    elif kind == "pyonmttok":
        opt["transforms"] = ["onmt_tokenize"]
        for side, entry in sides.items():
            params = dict(entry.get("params") or {})
            for key, value in list(params.items()):
                if key.endswith("path"):  # as OpenNMT-py's server: files under model_root
                    params[key] = os.path.join(root, value)
            if entry.get("mode") is not None:
                params["mode"] = entry["mode"]
            opt[f"{side}_onmttok_kwargs"] = repr(params)
    else:
        raise ConfError(f"{where}: tokenizer: type must be sentencepiece or pyonmttok, got "
                        f"{kind!r}")
    return opt


def read_conf(path: str) -> List[ModelSpec]:
    """The models of an OpenNMT-py server conf.json; refuses what it cannot serve, in one line
    naming the file and the field."""
    try:
        with open(path, encoding="utf-8") as f:
            conf = json.load(f)
    except OSError as err:
        raise ConfError(f"{path}: cannot read: {err.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfError(f"{path}: not JSON: {err}") from None
    if not isinstance(conf, dict) or not isinstance(conf.get("models"), list):
        raise ConfError(f"{path}: expected an object with a 'models' list")
    models_root = conf.get("models_root", "./available_models")  # as OpenNMT-py: from the cwd
    if not isinstance(models_root, str):
        raise ConfError(f"{path}: 'models_root' must be a folder path")
    specs, next_id = [], 0
    for number, entry in enumerate(conf["models"]):
        where = f"{path}: models[{number}]"
        if not isinstance(entry, dict):
            raise ConfError(f"{where}: expected an object")
        for name in CODE_FIELDS:
            if name in entry:
                raise ConfError(f"{where}: '{name}' names Python code to run; this server runs "
                                "no code from its configuration (use 'tokenizer')")
        for name in UNSUPPORTED_FIELDS:
            if name in entry:
                raise ConfError(f"{where}: '{name}' is not supported by this server")
        unknown = [name for name in entry if name not in KNOWN_FIELDS]
        if unknown:
            raise ConfError(f"{where}: unknown field(s) {', '.join(unknown)}")
        paths = entry.get("models", entry.get("model"))
        if paths is None:
            raise ConfError(f"{where}: needs 'model' (a checkpoint under models_root)")
        paths = paths if isinstance(paths, list) else [paths]
        if len(paths) != 1 or not isinstance(paths[0], str):
            raise ConfError(f"{where}: 'model' must be one checkpoint path")
        root = os.path.join(models_root, entry.get("model_root", ""))
        model_path = os.path.join(root, paths[0])
        if not os.path.exists(model_path):
            raise ConfError(f"{where}: model {paths[0]}: no such file under {root}")
        model_id = entry.get("id", next_id)
        if not isinstance(model_id, int) or isinstance(model_id, bool) or model_id < 0:
            raise ConfError(f"{where}: 'id' must be a non-negative integer")
        if any(s.id == model_id for s in specs):
            raise ConfError(f"{where}: id {model_id} is used twice")
        next_id = max(next_id, model_id + 1)
        user_opt = entry.get("opt") or {}
        if not isinstance(user_opt, dict):
            raise ConfError(f"{where}: 'opt' must be an object of translate options")
        opt = check_opt(user_opt, where)
        tokenizer = entry.get("tokenizer")
        if tokenizer is not None:
            if not isinstance(tokenizer, dict):
                raise ConfError(f"{where}: 'tokenizer' must be an object")
            opt.update(tokenizer_options(tokenizer, root, where))
        timeout = entry.get("timeout", -1)
        if timeout is None:
            timeout = -1
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise ConfError(f"{where}: 'timeout' must be a number of seconds (-1: never)")
        on_timeout = entry.get("on_timeout", "to_cpu")
        if on_timeout not in ("to_cpu", "unload"):
            raise ConfError(f"{where}: 'on_timeout' must be to_cpu or unload")
        src_lang, tgt_lang = entry.get("src_lang"), entry.get("tgt_lang")
        if src_lang is None and tgt_lang is None:
            src_lang, tgt_lang = guess_languages(model_path)
        specs.append(ModelSpec(model_id, model_path, opt, src_lang, tgt_lang, float(timeout),
                               on_timeout, bool(entry.get("load", False)), tokenizer,
                               dict(user_opt), entry.get("name")))
    if not specs:
        raise ConfError(f"{path}: 'models' is empty")
    return specs


def check_opt(opt: dict, where: str, command_line: bool = False) -> dict:
    """A model's translate options, without those a client or a conf may not set (nor, but
    COMMAND_LINE_OPTIONS, the server's ``command_line``)."""
    for name in opt:
        if name in REFUSED_OPTIONS:
            raise ConfError(f"{where}: opt '{name}' cannot be set for a served model")
        if name in COMMAND_LINE_OPTIONS and not command_line:
            raise ConfError(f"{where}: opt '{name}' names a folder of compiled code to load: "
                            "only the server's command line sets it")
    return dict(opt)


def read_argos_packages(folder: str, opt: dict) -> List[ModelSpec]:
    """A model for every Argos Translate package in ``folder`` (installed package folders and
    .argosmodel files, as LibreTranslate's packages folder holds them), its languages from its
    metadata.json, loaded at its first request, with the translate options ``opt``. Of two
    packages of one language pair the first in name order is served (a folder before its own
    .argosmodel), and one line says which was left out."""
    if not os.path.isdir(folder):
        raise ConfError(f"-argos_packages {folder}: not a folder")
    specs, served = [], {}
    for name in sorted(os.listdir(folder), key=lambda n: (n.endswith(argos.SUFFIX), n)):
        path = os.path.join(folder, name)
        if not argos.is_package(path):
            continue
        try:
            src_lang, tgt_lang = package_languages(path)
        except argos.ArgosError as err:
            raise ConfError(f"-argos_packages: {err}") from None
        if (src_lang, tgt_lang) in served:
            logger.info("-argos_packages: %s is left out: %s serves %s to %s", name,
                        served[src_lang, tgt_lang], src_lang, tgt_lang)
            continue
        served[src_lang, tgt_lang] = name
        specs.append(ModelSpec(len(specs), path, dict(opt), src_lang, tgt_lang, load=False,
                               user_opt=dict(opt), name=name))
    if not specs:
        raise ConfError(f"-argos_packages {folder}: no Argos Translate package in it (folders "
                        f"with metadata.json, or {argos.SUFFIX} files)")
    return specs


def package_languages(path: str) -> Tuple[str, str]:
    """The (from_code, to_code) of a package folder or .argosmodel file, from its metadata.json
    alone (a .argosmodel is not unpacked for it)."""
    if os.path.isdir(path):
        metadata = argos.read_metadata(path, path)
    else:
        try:
            with zipfile.ZipFile(path) as archive:
                names = [n for n in archive.namelist() if n.count("/") == 1
                         and n.endswith("/metadata.json")]
                if len(names) != 1:
                    raise argos.ArgosError(f"{path}: no metadata.json in its package folder")
                data = archive.read(names[0])
        except zipfile.BadZipFile as err:
            raise argos.ArgosError(f"{path}: not a readable {argos.SUFFIX} (a zip archive): "
                                   f"{err}") from None
        with tempfile.TemporaryDirectory(prefix="onmt_lite-argos-") as into:
            with open(os.path.join(into, "metadata.json"), "wb") as f:
                f.write(data)
            metadata = argos.read_metadata(into, path)
    return metadata["from_code"], metadata["to_code"]


# OpenNMT-py server options without a translate.py flag here, read by the server itself
# (report_align: each answer's alignment; batch_size: sentences per batch) or without effect on a
# CPU server that logs anyway (verbose, gpu)
SERVER_OPTIONS = frozenset({"report_align", "batch_size", "verbose", "gpu"})


def translate_options(spec: ModelSpec) -> argparse.Namespace:
    """translate.py's options for ``spec``: its defaults, then the spec's opt values checked as
    a YAML -config's are. Raises ConfError naming the option."""
    parser = build_parser()
    args = parser.parse_args(["-model", spec.path, "-src", "-"])
    actions = {a.dest: a for a in parser._actions}
    given = set()
    for name, value in spec.opt.items():
        if name in SERVER_OPTIONS:
            continue
        if name not in actions or name == "help":
            raise ConfError(f"{spec.describe()}: unknown option '{name}'")
        try:
            setattr(args, name, config_value(actions[name], value))
        except argparse.ArgumentTypeError as err:
            raise ConfError(f"{spec.describe()}: {name}: {err}") from None
        given.add(name)
    args.given_options = frozenset(given)
    return args
