"""Hugging Face Marian models (the OPUS-MT layout): the directory that ``MarianMTModel`` and
``MarianTokenizer.save_pretrained`` write, read as data (JSON, safetensors or a weights-only
torch file) and mapped onto onmt_lite's Transformer in its post-norm layout.

Three things come from the directory: the model (``config.json`` and the weights), the
tokenizer (``source.spm``, ``target.spm``, ``vocab.json``) and the generation defaults
(``generation_config.json``, else the generation keys of ``config.json``, as ``generate()``
takes them).
"""
import json
import os
import re
from typing import Dict, List, Optional, Sequence, Tuple

import sentencepiece
import torch

from onmt_lite.transforms import sentencepiece_pieces
from onmt_lite.vocab import Vocab

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "silu", "silu": "silu",
               "gelu_new": "gelu-tanh", "gelu_pytorch_tanh": "gelu-tanh"}
SPECIAL_DEFAULTS = {"unk_token": "<unk>", "eos_token": "</s>", "pad_token": "<pad>"}


class MarianError(ValueError):
    """A Marian directory onmt_lite cannot read; the message names the file and the problem."""


def is_marian_dir(path: str) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json"))


def _file(folder: str, name: str) -> str:
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        raise MarianError(f"{path}: missing (a Marian directory holds config.json, "
                          f"model.safetensors or pytorch_model.bin, source.spm, target.spm, "
                          f"vocab.json)")
    return path


def _json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except UnicodeDecodeError:
        raise MarianError(f"{path}: not UTF-8 text") from None
    except json.JSONDecodeError as err:
        raise MarianError(f"{path}: not valid JSON ({err.msg}, line {err.lineno})") from None
    if not isinstance(value, dict):
        raise MarianError(f"{path}: expected a JSON object")
    return value


# -- the model ------------------------------------------------------------------------------
def model_options(config: dict, path: str) -> dict:
    """onmt_lite model options of a MarianConfig; what onmt_lite lacks is refused by name."""
    def need(key, default=None):
        value = config.get(key, default)
        if value is None:
            raise MarianError(f"{path}: lacks {key}")
        return value

    if config.get("model_type") != "marian":
        raise MarianError(f"{path}: model_type {config.get('model_type')!r}; only Marian "
                          "(MarianMTModel) directories are read")
    for enc, dec in (("encoder_attention_heads", "decoder_attention_heads"),
                     ("encoder_ffn_dim", "decoder_ffn_dim")):
        if need(enc) != need(dec):
            raise MarianError(f"{path}: {enc} {config[enc]} differs from {dec} {config[dec]}; "
                              "onmt_lite needs them equal")
    activation = need("activation_function", "gelu")
    if activation not in ACTIVATIONS:
        raise MarianError(f"{path}: activation_function {activation!r} not supported "
                          f"(supported: {', '.join(ACTIVATIONS)})")
    if config.get("normalize_before") or config.get("add_final_layer_norm") or config.get(
            "normalize_embedding"):
        raise MarianError(f"{path}: pre-norm or embedding-norm Marian variants are not supported")
    shared = config.get("share_encoder_decoder_embeddings", True)
    if shared and config.get("decoder_vocab_size") not in (None, config.get("vocab_size")):
        raise MarianError(f"{path}: decoder_vocab_size differs from vocab_size with shared "
                          "embeddings")
    return {
        "model_type": "transformer", "enc_layers": need("encoder_layers"),
        "dec_layers": need("decoder_layers"), "hidden_size": need("d_model"),
        "word_vec_size": config["d_model"], "heads": config["encoder_attention_heads"],
        "transformer_ff": config["encoder_ffn_dim"], "dropout": 0.0, "attention_dropout": 0.0,
        "add_qkvbias": True, "add_ffnbias": True, "norm_eps": 1e-5,
        "share_embeddings": bool(shared),
        "share_decoder_embeddings": bool(config.get("tie_word_embeddings", True)),
        "layer_norm_position": "post", "pos_ffn_activation_fn": ACTIVATIONS[activation],
        "position_encoding_type": "SinusoidalMarian",
        "scale_embedding": bool(config.get("scale_embedding", False)),
        "max_position_embeddings": need("max_position_embeddings", 1024),
    }


def _read_weights(folder: str) -> Dict[str, torch.Tensor]:
    for name in WEIGHT_FILES:
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        try:
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file
                return load_file(path)
            return torch.load(path, map_location="cpu", weights_only=True)  # data only
        except Exception as err:  # each format has its own errors for damaged files
            detail = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
            raise MarianError(f"{path}: unreadable weights ({type(err).__name__}: {detail})"
                              ) from None
    raise MarianError(f"{os.path.join(folder, WEIGHT_FILES[0])}: missing (nor "
                      f"{WEIGHT_FILES[1]}): the directory has no weights")


LAYER_NAMES = {  # Hugging Face -> onmt_lite, inside a layer
    "self_attn.q_proj": "self_attn.linear_query", "self_attn.k_proj": "self_attn.linear_keys",
    "self_attn.v_proj": "self_attn.linear_values", "self_attn.out_proj": "self_attn.final_linear",
    "fc1": "feed_forward.w_1", "fc2": "feed_forward.w_2",
    "final_layer_norm": "feed_forward.layer_norm",
}
ENCODER_NAMES = {**LAYER_NAMES, "self_attn_layer_norm": "layer_norm"}
DECODER_NAMES = {**LAYER_NAMES, "self_attn_layer_norm": "layer_norm_1",
                 "encoder_attn.q_proj": "context_attn.linear_query",
                 "encoder_attn.k_proj": "context_attn.linear_keys",
                 "encoder_attn.v_proj": "context_attn.linear_values",
                 "encoder_attn.out_proj": "context_attn.final_linear",
                 "encoder_attn_layer_norm": "layer_norm_2"}


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a is b or (a.shape == b.shape and torch.equal(a, b))


def convert_weights(hf: Dict[str, torch.Tensor], opt: dict,
                    path: str) -> Tuple[Dict[str, torch.Tensor], Dict[str, torch.Tensor]]:
    """Hugging Face state dict -> (onmt_lite model state, generator state); sets the options
    ``share_embeddings`` and ``share_decoder_embeddings`` from what the weights share."""
    hf = {k[len("model."):] if k.startswith("model.") else k: v for k, v in hf.items()}
    state: Dict[str, torch.Tensor] = {}
    used = set()

    def take(*keys: str) -> torch.Tensor:
        """The first of ``keys`` that the file has."""
        key = next((k for k in keys if k in hf), None)
        if key is None:
            raise MarianError(f"{path}: weight {keys[0]} missing")
        used.add(key)
        return hf[key]

    decoder_keys = ("decoder.embed_tokens.weight",) + (
        ("shared.weight",) if opt["share_embeddings"] else ())
    encoder_embedding = take("encoder.embed_tokens.weight", "shared.weight")
    decoder_embedding = take(*decoder_keys)
    # tied or not as the weights are: transformers unties them with tie_word_embeddings false
    opt["share_embeddings"] = same(encoder_embedding, decoder_embedding)
    state["encoder.embeddings.embeddings.weight"] = encoder_embedding
    state["decoder.embeddings.embeddings.weight"] = decoder_embedding
    for side, names, layers in (("encoder", ENCODER_NAMES, opt["enc_layers"]),
                                ("decoder", DECODER_NAMES, opt["dec_layers"])):
        for i in range(layers):
            for theirs, ours in names.items():
                for kind in ("weight", "bias"):
                    state[f"{side}.layers.{i}.{ours}.{kind}"] = take(
                        f"{side}.layers.{i}.{theirs}.{kind}")
    output = take("lm_head.weight") if "lm_head.weight" in hf else decoder_embedding
    opt["share_decoder_embeddings"] = same(output, decoder_embedding)
    generator = {
        "weight": output,
        "bias": take("final_logits_bias").reshape(-1) if "final_logits_bias" in hf
        else torch.zeros(decoder_embedding.size(0)),
    }
    # the position tables are computed; shared.weight is a copy the layers do not read
    ignored = {k for k in hf if "embed_positions" in k or k == "shared.weight"}
    unused = sorted(set(hf) - used - ignored)
    if unused:
        raise MarianError(f"{path}: weights onmt_lite's Marian layout does not use: "
                          f"{', '.join(unused[:3])}{' ...' if len(unused) > 3 else ''}")
    return state, generator


# -- the tokenizer --------------------------------------------------------------------------
def _vocab(path: str, roles: Dict[str, str], size: int, start: Optional[int] = None) -> Vocab:
    """vocab.json as a Vocab; the decoder's first input is token ``start`` (default pad)."""
    mapping = _json(path)
    ids = sorted(mapping.values()) if all(isinstance(i, int) for i in mapping.values()) else None
    if ids != list(range(len(mapping))):
        raise MarianError(f"{path}: token ids are not 0 to {len(mapping) - 1}")
    if len(mapping) != size:
        raise MarianError(f"{path}: has {len(mapping)} tokens, the model's embeddings {size}")
    itos = [""] * len(mapping)
    for token, i in mapping.items():
        itos[i] = token
    bos = itos[start] if start is not None and 0 <= start < len(itos) else roles["pad"]
    try:
        return Vocab(itos, {**roles, "bos": bos})
    except ValueError as err:
        raise MarianError(f"{path}: {err}") from None


def _spm(data: bytes, name: str) -> sentencepiece.SentencePieceProcessor:
    try:
        return sentencepiece.SentencePieceProcessor(model_proto=data)
    except (RuntimeError, TypeError) as err:
        raise MarianError(f"{name}: not a sentencepiece model "
                          f"({str(err).strip().splitlines()[0][:200]})") from None


class MarianTokenizer:
    """Raw text <-> pieces exactly as ``MarianTokenizer`` encodes and
    ``decode(skip_special_tokens=True)`` decodes.

    Encoding keeps special-token strings found in the text as tokens, a leading ``>>xx<<``
    language code as one token, and ends the source with ``</s>``. Decoding drops the special
    tokens and joins the rest with the source model unless the vocabularies are separate, as
    ``transformers`` does.
    """

    def __init__(self, source_spm: bytes, target_spm: bytes, specials: Sequence[str],
                 eos: str, separate_vocabs: bool = False,
                 names: Sequence[str] = ("source.spm", "target.spm")):
        self.src = _spm(source_spm, names[0])
        self.tgt = _spm(target_spm, names[1])
        self.names = dict(zip(("src", "tgt"), names))
        self.decoding = self.tgt if separate_vocabs else self.src
        self.specials, self.eos = list(specials), eos
        self.split = re.compile("(" + "|".join(map(re.escape, self.specials)) + ")")

    def pieces(self, side: str):
        """(model file, its ordinary pieces): what the model's vocabulary should hold."""
        return self.names[side], sentencepiece_pieces(self.src if side == "src" else self.tgt)

    def encode(self, line: str, side: str = "src") -> List[str]:
        model = self.src if side == "src" else self.tgt
        tokens: List[str] = []
        for chunk in self.split.split(line):
            if chunk in self.specials:
                tokens.append(chunk)
            elif chunk:
                if chunk.startswith(">>") and (end := chunk.find("<<")) != -1:
                    tokens.append(chunk[:end + 2])
                    chunk = chunk[end + 2:]
                tokens.extend(model.encode(chunk, out_type=str))
        return tokens + [self.eos] if side == "src" else tokens

    def decode(self, pieces: Sequence[str]) -> str:
        kept = [p for p in pieces if p not in self.specials]
        return self.decoding.decode_pieces(kept).replace("\u2581", " ").strip()


def tokenizer_files(folder: str) -> dict:
    """The tokenizer's files as data, to keep in a converted checkpoint."""
    config_path = os.path.join(folder, "tokenizer_config.json")
    config = _json(config_path) if os.path.isfile(config_path) else {}
    files = {"source_spm": _file(folder, "source.spm"), "target_spm": _file(folder, "target.spm")}
    data = {}
    for key, path in files.items():
        with open(path, "rb") as f:
            data[key] = f.read()
    specials = {}
    for key, default in SPECIAL_DEFAULTS.items():
        value = config.get(key, default)
        specials[key] = value.get("content", default) if isinstance(value, dict) else value
    return {"kind": "marian", **data, "specials": specials,
            "separate_vocabs": bool(config.get("separate_vocabs", False))}


def build_tokenizer(files: dict, where: str) -> MarianTokenizer:
    """The tokenizer of ``files`` (tokenizer_files), from the directory or checkpoint ``where``."""
    specials = files["specials"]
    return MarianTokenizer(files["source_spm"], files["target_spm"],
                           [specials[k] for k in ("eos_token", "unk_token", "pad_token")],
                           specials["eos_token"], files["separate_vocabs"],
                           [os.path.join(where, name) if os.path.isdir(where) else
                            f"{where} ({name})" for name in ("source.spm", "target.spm")])


# -- generation defaults --------------------------------------------------------------------
GENERATION_KEYS = ("max_length", "max_new_tokens", "min_length", "min_new_tokens", "num_beams",
                   "bad_words_ids", "forced_eos_token_id", "renormalize_logits", "eos_token_id",
                   "decoder_start_token_id", "num_return_sequences", "do_sample",
                   "repetition_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
                   "suppress_tokens", "begin_suppress_tokens", "forced_bos_token_id",
                   "sequence_bias", "num_beam_groups", "diversity_penalty", "length_penalty",
                   "early_stopping", "exponential_decay_length_penalty", "force_words_ids")
# settings whose effect onmt_lite lacks, with the value that means "off"
UNSUPPORTED = {"do_sample": False, "encoder_no_repeat_ngram_size": 0, "suppress_tokens": None,
               "begin_suppress_tokens": None, "forced_bos_token_id": None, "sequence_bias": None,
               "num_beam_groups": 1, "diversity_penalty": 0.0,
               "exponential_decay_length_penalty": None, "force_words_ids": None}
# settings of Hugging Face's search: honoured with -search hf; under OpenNMT-py's search
# the beam's own rules ignore them, the others are refused
HF_SEARCH = {"length_penalty": ("alpha", None), "early_stopping": ("early_stopping", None),
             "renormalize_logits": ("renormalize_logits", None),
             "no_repeat_ngram_size": ("block_ngram_repeat", 0)}


def generation_defaults(folder: str, config: dict) -> dict:
    """generation_config.json, else the generation keys of config.json (as ``generate()``
    falls back to the model's config)."""
    path = os.path.join(folder, "generation_config.json")
    source = _json(path) if os.path.isfile(path) else config
    return {key: source[key] for key in GENERATION_KEYS if key in source}


def _ids(value) -> List[int]:
    """A generation setting's token id or ids as a list (None: none)."""
    return [value] if isinstance(value, int) else list(value or [])


def decoding_settings(generation: dict, tgt_vocab: Vocab, search: str = "onmt",
                      origin: str = "generation_config.json") -> Tuple[dict, List[int], bool]:
    """Hugging Face generation settings -> (DecodingOptions values, banned token ids,
    forced </s> at the last step) under ``search`` (a preset name). Settings onmt_lite cannot
    honour are refused by name."""
    for key, off in UNSUPPORTED.items():
        if generation.get(key, off) not in (off, [], {}):
            raise MarianError(f"{origin}: {key}={generation[key]!r} is not supported")
    if _ids(generation.get("eos_token_id", tgt_vocab.eos)) != [tgt_vocab.eos]:
        raise MarianError(f"{origin}: eos_token_id {generation['eos_token_id']!r} is not the "
                          f"vocabulary's {tgt_vocab.specials['eos']} ({tgt_vocab.eos})")
    start = generation.get("decoder_start_token_id", tgt_vocab.bos)
    if start != tgt_vocab.bos:
        raise MarianError(f"{origin}: decoder_start_token_id {start} is not the vocabulary's "
                          f"{tgt_vocab.specials['bos']} ({tgt_vocab.bos})")
    options = {}
    if "max_new_tokens" in generation:  # counts generated tokens, as -max_length does
        options["max_length"] = generation["max_new_tokens"]
    elif "max_length" in generation:  # counts the decoder's start token too
        options["max_length"] = max(generation["max_length"] - 1, 1)
    minimum = max(generation.get("min_length", 0) - 1, generation.get("min_new_tokens") or 0)
    if minimum > 0:
        options["min_length"] = minimum
    if "num_beams" in generation:
        options["beam_size"] = generation["num_beams"]
    if "num_return_sequences" in generation:
        options["n_best"] = generation["num_return_sequences"]
    if generation.get("repetition_penalty", 1.0) != 1.0:
        options["repetition_penalty"] = generation["repetition_penalty"]
    for key, (name, off) in HF_SEARCH.items():
        value = generation.get(key)
        if value is None:
            continue
        if search == "hf":
            options[name] = str(value).lower() if key == "early_stopping" else value
        elif off is not None and value != off:
            raise MarianError(f"{origin}: {key}={value!r} needs -search hf")
    banned = []
    for ids in generation.get("bad_words_ids") or []:
        if len(ids) != 1:
            raise MarianError(f"{origin}: bad_words_ids of several tokens ({ids}) are not "
                              "supported")
        banned.append(ids[0])
    forced = _ids(generation.get("forced_eos_token_id"))
    if forced and forced != [tgt_vocab.eos]:
        raise MarianError(f"{origin}: forced_eos_token_id {forced} is not </s>")
    # fairseq and TensorFlow end at their own limits: fairseq forces </s> after -max_length
    # tokens; TensorFlow returns a hypothesis that never ended with all -max_length tokens
    return options, banned, bool(forced) and search in ("hf", "onmt")


# -- the directory --------------------------------------------------------------------------
def read_marian(folder: str) -> dict:
    """A Marian directory -> the fields of a Checkpoint (see checkpoint.py)."""
    config_path = _file(folder, "config.json")
    config = _json(config_path)
    opt = model_options(config, config_path)
    tokenizer = tokenizer_files(folder)
    specials = tokenizer["specials"]
    weights = _read_weights(folder)
    model_state, generator_state = convert_weights(weights, opt, folder)
    roles = {"unk": specials["unk_token"], "pad": specials["pad_token"],
             "eos": specials["eos_token"]}
    start = config.get("decoder_start_token_id", config.get("pad_token_id"))
    src_vocab = _vocab(_file(folder, "vocab.json"), roles,
                       model_state["encoder.embeddings.embeddings.weight"].size(0))
    tgt_file = "target_vocab.json" if tokenizer["separate_vocabs"] else "vocab.json"
    tgt_vocab = _vocab(_file(folder, tgt_file), roles, generator_state["weight"].size(0), start)
    return dict(opt=opt, src_vocab=src_vocab, tgt_vocab=tgt_vocab, model_state=model_state,
                generator_state=generator_state, origin="marian",
                generation=generation_defaults(folder, config), tokenizer=tokenizer)


def describe(options: dict, banned: Sequence[int], forced: bool,
             vocab: Optional[Vocab] = None) -> str:
    """One line saying which generation defaults apply."""
    parts = [f"-{k} {v}" for k, v in options.items()]
    if banned:
        names = [vocab.itos[i] if vocab and i < len(vocab) else str(i) for i in banned]
        parts.append(f"never generating {', '.join(names)}")
    if forced:
        parts.append("</s> forced at -max_length")
    return ", ".join(parts)
