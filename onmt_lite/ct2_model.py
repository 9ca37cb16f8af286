"""CTranslate2 Transformer model directories (``model.bin``, ``config.json``, and
``shared_vocabulary.json|txt`` or ``source_vocabulary.*`` and ``target_vocabulary.*``) as
onmt_lite checkpoints, read without the ``ctranslate2`` package (ct2_format.py reads model.bin).

The Transformer spec's variables map onto onmt_lite's Transformer (models/transformer.py) with
CTranslate2's meaning: the fused query/key/value projections are split, layer norms take
``layer_norm_epsilon`` from config.json (else 1e-5, CTranslate2's default with a bias), the
embeddings are scaled as ``scale_embeddings`` says, and the position tables are the stored
``position_encodings/encodings`` or, where none is stored, CTranslate2's own sinusoids (sines
then cosines, positions counted from 1): both go into the model's tables as they are
(``Checkpoint.position_tables``).

Weights stored as float16 or bfloat16 are read as float32. Quantized weights are dequantized
for the exact path: int8 rows are ``int8 / scale`` (one scale per output row), int16 weights
``int16 / scale`` (one scale). The int8 weights and their scales are also kept as stored, by
onmt_lite weight name, in ``Checkpoint.int8_weights`` ({name: (int8 tensor (out, in), scale
(out,))}): what an int8 decoding path can use without quantizing again.

Two things CTranslate2 has that onmt_lite's vocabularies lack become rows of their own: a
decoder that starts from a zero embedding (Marian conversions, ``start_from_zero_embedding``),
and a padding token where the vocabulary has none. Each such row has a zero embedding and a
zero output row with bias -1e9: it never wins and adds exactly nothing to the softmax, as a
token that is not there; it is also among the banned tokens.

What onmt_lite's Transformer cannot run is refused with one message naming the file and the
feature: relative positions, rotary embeddings, ALiBi, multi-query (or grouped) attention,
gated or RMS-normalised layers, several source embeddings, and other specs than a Transformer
encoder-decoder.
"""
import json
import math
import os
from typing import Dict, List, Optional, Tuple

import torch

from onmt_lite.ct2_format import ModelBin, ModelBinError, read_model_bin
from onmt_lite.vocab import Vocab

SPECS = {"TransformerSpec": None, "TransformerBase": 8, "TransformerBig": 16, "": 8}
MAX_REVISION = 7
ACTIVATIONS = {0: "relu", 1: "gelu-tanh", 2: "silu", 3: "gelu"}  # common_spec.Activation
GENERATED_POSITIONS = 5000  # rows of CTranslate2's own sinusoid table (it grows on demand)
ABSENT_BIAS = -1e9  # an added row's output bias: exp(-1e9 - max) is 0 in float32
# variable names that mean a feature onmt_lite lacks -> that feature, for the message
FEATURES = {"relative_position": "relative position representations",
            "relative_attention_bias": "relative attention bias (T5)",
            "rotary": "rotary position embeddings", "alibi": "ALiBi attention biases",
            "num_heads_kv": "multi-query or grouped-query attention",
            "linear_0_noact": "gated feed-forward layers (GLU)",
            "layernorm_embedding": "a layer norm on the embeddings",
            "project_in": "projections around the decoder", "queries_scale": "scaled queries",
            "embeddings_1": "several source embeddings (source features)",
            "weight_zero": "AWQ quantization", "sliding_window": "sliding-window attention",
            "q_norm": "query/key normalisation", "input_layer_norm": "parallel or doubled "
            "layer norms", "shared_layer_norm": "parallel residual layers",
            "scale_outputs": "scaled decoder outputs", "layer_scalar": "layer scalars"}
# attributes that are read, or harmless at these values
ATTRIBUTES = {"num_heads", "pre_norm", "activation", "embeddings_merge", "alignment_layer",
              "alignment_heads", "scale_embeddings", "multiply_by_sqrt_depth",
              "start_from_zero_embedding", "alibi", "alibi_use_positive_positions",
              "scale_alibi", "multi_query_attention"}


class CT2Error(ValueError):
    """A CTranslate2 model onmt_lite cannot read; the message names the file and the problem."""


def _v1_name(name: str) -> str:
    """Revision 1's variable names (OpenNMT-tf's), as CTranslate2's map_v1_variable_name."""
    for old, new in (("transformer/", ""), (":0", ""), ("w_embs", "embeddings/weight"),
                     ("kernel", "weight"), ("LayerNorm", "layer_norm"), ("dense", "projection"),
                     ("conv1d_", "linear_"), ("conv1d", "linear_0")):
        name = name.replace(old, new, 1)
    if "encoder" in name:
        return name.replace("multi_head", "self_attention", 1)
    return name.replace("masked_multi_head", "self_attention", 1).replace(
        "multi_head", "attention", 1)


def _refuse_features(model: ModelBin) -> None:
    for name, value in list(model.variables.items()) + [(a, None) for a in model.aliases]:
        for key, feature in FEATURES.items():
            if key in name.split("/")[-1] or f"/{key}/" in f"/{name}/":
                if key == "alibi" and value is not None and not value.item():
                    continue  # alibi false
                raise CT2Error(f"{model.path}: uses {feature} ({name}), which onmt_lite's "
                               "Transformer does not have")


def _attribute(model: ModelBin, scope: str, name: str, default):
    """``scope/name``, else (revisions before 5) the model-wide ``name``."""
    value = model.scalar(f"{scope}/{name}")
    return model.scalar(name, default) if value is None else value


def _same_on_both_sides(model: ModelBin, name: str, default):
    values = [_attribute(model, side, name, default) for side in ("encoder", "decoder")]
    if values[0] != values[1]:
        raise CT2Error(f"{model.path}: encoder {name} {values[0]} and decoder {name} "
                       f"{values[1]} differ; onmt_lite needs them equal")
    return values[0]


def _embedding_scale(model: ModelBin, dim: int) -> bool:
    """Whether embeddings are scaled by sqrt(dim) (CTranslate2's build_embeddings_scale)."""
    found = []
    for side in ("encoder", "decoder"):
        value = model.get(f"{side}/scale_embeddings")
        if value is None:
            value = model.get(f"{side}/embeddings/multiply_by_sqrt_depth")
        if value is None or (value.dtype == torch.int8 and value.item()):
            found.append(True)
        elif value.dtype == torch.int8 or value.item() == 1.0:
            found.append(False)
        elif abs(value.item() - math.sqrt(dim)) <= 1e-6 * math.sqrt(dim):
            found.append(True)
        else:
            raise CT2Error(f"{model.path}: {side} embeddings scaled by {value.item()}: onmt_lite "
                           f"scales by sqrt({dim}) or not at all")
    if found[0] != found[1]:
        raise CT2Error(f"{model.path}: the encoder's embeddings are {'' if found[0] else 'not '}"
                       "scaled, the decoder's are: onmt_lite needs them alike")
    return found[0]


def ct2_sinusoids(length: int, dim: int) -> torch.Tensor:
    """CTranslate2's generated position table (src/layers/common.cc): sines then cosines of
    (position + 1) * timescale, timescales exp(-j log(10000) / (dim / 2 - 1)), in float32."""
    increment = torch.tensor(math.log(10000.0) / (dim // 2 - 1), dtype=torch.float32)
    timescales = torch.exp(-increment * torch.arange(dim // 2, dtype=torch.float32))
    scaled = torch.arange(1, length + 1, dtype=torch.float32).unsqueeze(1) * timescales
    return torch.cat([torch.sin(scaled), torch.cos(scaled)], 1)


class _Weights:
    """Takes variables by name, dequantized to float32; records what was taken and keeps the
    int8 weights with their scales."""

    def __init__(self, model: ModelBin):
        self.model, self.used = model, set()
        self.int8: Dict[str, Tuple[torch.Tensor, torch.Tensor]] = {}

    def has(self, name: str) -> bool:
        return self.model.get(name) is not None

    def raw(self, name: str) -> torch.Tensor:
        value = self.model.get(name)
        if value is None:
            raise CT2Error(f"{self.model.path}: variable {name} missing")
        self.used.add(self.model.aliases.get(name, name))
        return value

    def take(self, name: str) -> torch.Tensor:
        value = self.raw(name)
        if value.dtype in (torch.int8, torch.int16):
            scale = self.raw(name + "_scale").float()
            if value.dtype == torch.int8 and scale.dim() == 1:
                return value.float() / scale.unsqueeze(1)
            return value.float() / scale
        return value.float()

    def linear(self, name: str, ours: List[str], state: dict, bias: bool) -> None:
        """CTranslate2 linear ``name`` (fused when ``ours`` names several) into ``state``."""
        weight = self.take(f"{name}/weight")
        parts = len(ours)
        if weight.size(0) % parts:
            raise CT2Error(f"{self.model.path}: {name}/weight has {weight.size(0)} rows, not "
                           f"{parts} equal parts")
        has_bias = self.has(f"{name}/bias")
        biases = self.take(f"{name}/bias").chunk(parts) if has_bias else None
        stored = self.model.get(f"{name}/weight")
        for i, (target, part) in enumerate(zip(ours, weight.chunk(parts))):
            state[f"{target}.weight"] = part
            if bias:
                state[f"{target}.bias"] = biases[i] if has_bias else torch.zeros(part.size(0))
            if stored.dtype == torch.int8:
                scale = self.raw(f"{name}/weight_scale").float()
                self.int8[f"{target}.weight"] = (stored.chunk(parts)[i],
                                                 scale.chunk(parts)[i] if scale.dim() else scale)

    def norm(self, name: str, ours: str, state: dict) -> None:
        if not self.has(f"{name}/beta"):
            raise CT2Error(f"{self.model.path}: {name} is an RMS norm (no beta): onmt_lite's "
                           "layer norms have a bias")
        state[f"{ours}.weight"] = self.take(f"{name}/gamma")
        state[f"{ours}.bias"] = self.take(f"{name}/beta")


def _biases(model: ModelBin) -> Tuple[bool, bool]:
    """(attention linears have biases, feed-forward linears have biases)."""
    names = list(model.variables) + list(model.aliases)
    attention = any(n.endswith("/bias") and "attention/linear" in n for n in names)
    ffn = any(n.endswith("/bias") and "/ffn/linear" in n for n in names)
    return attention, ffn


def _layers(weights: _Weights, side: str, count: int, state: dict, bias: Tuple[bool, bool]):
    """Each layer's attention, feed-forward and norms into ``state``."""
    qkv = ["linear_query", "linear_keys", "linear_values"]
    for i in range(count):
        theirs, ours = f"{side}/layer_{i}", f"{side}.layers.{i}"
        weights.linear(f"{theirs}/self_attention/linear_0",
                       [f"{ours}.self_attn.{n}" for n in qkv], state, bias[0])
        weights.linear(f"{theirs}/self_attention/linear_1", [f"{ours}.self_attn.final_linear"],
                       state, bias[0])
        first = "layer_norm" if side == "encoder" else "layer_norm_1"
        weights.norm(f"{theirs}/self_attention/layer_norm", f"{ours}.{first}", state)
        if side == "decoder":
            weights.linear(f"{theirs}/attention/linear_0", [f"{ours}.context_attn.linear_query"],
                           state, bias[0])
            weights.linear(f"{theirs}/attention/linear_1",
                           [f"{ours}.context_attn.{n}" for n in qkv[1:]], state, bias[0])
            weights.linear(f"{theirs}/attention/linear_2", [f"{ours}.context_attn.final_linear"],
                           state, bias[0])
            weights.norm(f"{theirs}/attention/layer_norm", f"{ours}.layer_norm_2", state)
        for n, target in (("linear_0", "w_1"), ("linear_1", "w_2")):
            weights.linear(f"{theirs}/ffn/{n}", [f"{ours}.feed_forward.{target}"], state, bias[1])
        weights.norm(f"{theirs}/ffn/layer_norm", f"{ours}.feed_forward.layer_norm", state)


def _count_layers(model: ModelBin, side: str) -> int:
    count = 0
    while any(n.startswith(f"{side}/layer_{count}/") for n in model.variables):
        count += 1
    if not count:
        raise CT2Error(f"{model.path}: no {side} layers ({side}/layer_0/...): not a Transformer "
                       "encoder-decoder")
    return count


def _position_table(weights: _Weights, side: str, dim: int) -> torch.Tensor:
    name = f"{side}/position_encodings/encodings"
    if weights.has(name):
        table = weights.take(name)
        if table.dim() != 2 or table.size(1) != dim:
            raise CT2Error(f"{weights.model.path}: {name} has shape {tuple(table.shape)}, not "
                           f"(positions, {dim})")
        return table
    return ct2_sinusoids(GENERATED_POSITIONS, dim)


# -- vocabularies and config ------------------------------------------------------------------
def _json_file(path: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except UnicodeDecodeError:
        raise CT2Error(f"{path}: not UTF-8 text") from None
    except json.JSONDecodeError as err:
        raise CT2Error(f"{path}: not valid JSON ({err.msg}, line {err.lineno})") from None
    except OSError as err:
        raise CT2Error(f"{path}: cannot read: {err.strerror}") from None


def read_config(folder: str) -> dict:
    """config.json (CTranslate2's defaults where it lacks a key, or where there is none)."""
    path = os.path.join(folder, "config.json")
    config = _json_file(path) if os.path.isfile(path) else {}
    if not isinstance(config, dict):
        raise CT2Error(f"{path}: expected a JSON object")
    return {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>",
            "decoder_start_token": "<s>", "add_source_bos": False, "add_source_eos": False,
            **config}


def read_vocabulary(folder: str, side: str) -> List[str]:
    """The ``side`` ("source" or "target") tokens: shared_vocabulary.json|txt, else
    SIDE_vocabulary.json|txt (a JSON list, or one token a line)."""
    names = [f"{stem}_vocabulary.{ext}" for stem in ("shared", side) for ext in ("json", "txt")]
    for name in names:
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        if name.endswith(".json"):
            tokens = _json_file(path)
            if not (isinstance(tokens, list) and all(isinstance(t, str) for t in tokens)):
                raise CT2Error(f"{path}: expected a JSON list of tokens")
            return tokens
        try:
            with open(path, encoding="utf-8") as f:
                return [line.rstrip("\r\n") for line in f]
        except UnicodeDecodeError:
            raise CT2Error(f"{path}: not UTF-8 text") from None
    raise CT2Error(f"{os.path.join(folder, names[0])}: missing (nor {', '.join(names[1:])}): the "
                   "model has no vocabulary")


def _added_row(tokens: List[str], name: str) -> str:
    """A token name for an added row that the vocabulary does not hold."""
    while name in tokens:
        name = name[:-1] + "_>"
    return name


def _with_rows(tokens: List[str], embedding: torch.Tensor, names: List[str]):
    """``tokens`` and ``embedding`` with one zero row per name in ``names``."""
    if not names:
        return tokens, embedding
    zeros = embedding.new_zeros(len(names), embedding.size(1))
    return tokens + names, torch.cat([embedding, zeros])


def _vocabularies(folder: str, config: dict, state: dict, generator: dict, start_zero: bool,
                  path: str):
    """(source Vocab, target Vocab, the target rows added): a pad row where a side has none,
    a start row where the decoder starts from a zero embedding (see the module docstring)."""
    src, tgt = read_vocabulary(folder, "source"), read_vocabulary(folder, "target")
    for side, tokens, key in (("source", src, "encoder"), ("target", tgt, "decoder")):
        rows = state[f"{key}.embeddings.embeddings.weight"].size(0)
        if len(tokens) != rows:
            raise CT2Error(f"{path}: the {side} vocabulary has {len(tokens)} tokens, the "
                           f"{key}'s embeddings {rows}")
    roles = {"unk": config["unk_token"], "eos": config["eos_token"]}
    pad = {side: next((t for t in ("<blank>", "<pad>") if t in tokens), None)
           for side, tokens in (("src", src), ("tgt", tgt))}
    start = config["decoder_start_token"]
    if start is None and not start_zero:
        raise CT2Error(f"{path}: decoder_start_token is null (the start token comes with each "
                       "target prefix), which onmt_lite does not take")
    added = []
    if pad["tgt"] is None or start_zero:
        added.append(_added_row(tgt, "<pad>"))
        pad["tgt"] = added[0]
    src_added = [] if pad["src"] is not None else [_added_row(src, "<pad>")]
    pad["src"] = pad["src"] or (src_added[0] if src_added else None)
    src, state["encoder.embeddings.embeddings.weight"] = _with_rows(
        src, state["encoder.embeddings.embeddings.weight"], src_added)
    tgt, state["decoder.embeddings.embeddings.weight"] = _with_rows(
        tgt, state["decoder.embeddings.embeddings.weight"], added)
    if added:
        generator["weight"] = torch.cat([generator["weight"],
                                         generator["weight"].new_zeros(len(added),
                                                                       generator["weight"].size(1))])
        generator["bias"] = torch.cat([generator["bias"], torch.full((len(added),), ABSENT_BIAS)])
    try:
        # the source's bos role matters only with add_source_bos: <unk> where it has none
        src_vocab = Vocab(src, {**roles, "pad": pad["src"], "bos": config["bos_token"]
                                if config["bos_token"] in src else config["unk_token"]})
        tgt_vocab = Vocab(tgt, {**roles, "pad": pad["tgt"],
                                "bos": pad["tgt"] if start_zero else start})
    except ValueError as err:
        raise CT2Error(f"{path}: {err} (config.json names them)") from None
    return src_vocab, tgt_vocab, [tgt_vocab.stoi[name] for name in added], len(src_added)


# -- the model ------------------------------------------------------------------------------
def _options(model: ModelBin, config: dict, dim: int, ff: int, layers: Tuple[int, int],
             bias: Tuple[bool, bool], positions: int) -> dict:
    """onmt_lite model options of the spec's attributes."""
    heads = _same_on_both_sides(model, "num_heads", SPECS.get(model.spec) or 8)
    if config.get("multi_query_attention"):
        raise CT2Error(f"{model.path}: uses multi-query attention (config.json), which onmt_lite's "
                       "Transformer does not have")
    if dim % heads:
        raise CT2Error(f"{model.path}: {heads} heads do not divide the width {dim}")
    activation = _same_on_both_sides(model, "activation", 0)
    if activation not in ACTIVATIONS:
        raise CT2Error(f"{model.path}: activation {activation} (CTranslate2's enum) is not "
                       f"supported (supported: {', '.join(ACTIVATIONS.values())})")
    pre_norm = bool(_same_on_both_sides(model, "pre_norm", 1))
    for side in ("encoder", "decoder"):
        if pre_norm and model.get(f"{side}/layer_norm/gamma") is None:
            raise CT2Error(f"{model.path}: a pre-norm {side} without its final layer norm: "
                           "onmt_lite's pre-norm Transformer ends with one")
    epsilon = config.get("layer_norm_epsilon")
    return {"model_type": "transformer", "enc_layers": layers[0], "dec_layers": layers[1],
            "hidden_size": dim, "word_vec_size": dim, "heads": int(heads), "transformer_ff": ff,
            "dropout": 0.0, "attention_dropout": 0.0, "add_qkvbias": bias[0],
            "add_ffnbias": bias[1], "norm_eps": 1e-5 if epsilon is None else float(epsilon),
            "share_embeddings": False, "share_decoder_embeddings": False,
            "layer_norm_position": "pre" if pre_norm else "post",
            "pos_ffn_activation_fn": ACTIVATIONS[activation],
            "position_encoding_type": "SinusoidalInterleaved",  # replaced by position_tables
            "scale_embedding": _embedding_scale(model, dim), "max_position_embeddings": positions}


def _unused(model: ModelBin, used: set) -> List[str]:
    """Variables neither mapped, nor a mapped weight's scale, nor a known attribute."""
    return sorted(name for name in model.variables
                  if name not in used and name[:-len("_scale")] not in used
                  and name.split("/")[-1] not in ATTRIBUTES)


def _kept_int8(weights: _Weights, added: Dict[str, int]) -> dict:
    """The int8 embeddings and output weights by onmt_lite name, with zero rows (scale 1, as
    CTranslate2 scales a zero row) for the rows added."""
    out = dict(weights.int8)
    for theirs, ours in (("encoder/embeddings_0/weight", "encoder.embeddings.embeddings.weight"),
                         ("encoder/embeddings/weight", "encoder.embeddings.embeddings.weight"),
                         ("decoder/embeddings/weight", "decoder.embeddings.embeddings.weight"),
                         ("decoder/projection/weight", "generator.weight")):
        stored = weights.model.get(theirs)
        if stored is None or stored.dtype != torch.int8:
            continue
        scale = weights.model.get(theirs + "_scale").float()
        rows = added.get(ours, 0)
        out[ours] = (torch.cat([stored, stored.new_zeros(rows, stored.size(1))]),
                     torch.cat([scale, scale.new_ones(rows)]))
    return out


def read_ct2(folder: str) -> dict:
    """A CTranslate2 model directory -> the fields of a Checkpoint (see checkpoint.py)."""
    path = os.path.join(folder, "model.bin")
    try:
        model = read_model_bin(path)
    except ModelBinError as err:
        raise CT2Error(str(err)) from None
    if model.spec not in SPECS:
        raise CT2Error(f"{path}: spec {model.spec!r} is not a Transformer encoder-decoder "
                       "(TransformerSpec): onmt_lite reads those only")
    if model.revision > MAX_REVISION:
        raise CT2Error(f"{path}: TransformerSpec revision {model.revision}; this reader knows "
                       f"revisions 1 to {MAX_REVISION}")
    if model.revision == 1:
        model.variables = {_v1_name(k): v for k, v in model.variables.items()}
    _refuse_features(model)
    config = read_config(folder)
    weights = _Weights(model)
    embedding = "encoder/embeddings_0/weight" if weights.has("encoder/embeddings_0/weight") \
        else "encoder/embeddings/weight"
    state = {"encoder.embeddings.embeddings.weight": weights.take(embedding),
             "decoder.embeddings.embeddings.weight": weights.take("decoder/embeddings/weight")}
    dim = state["encoder.embeddings.embeddings.weight"].size(1)
    tables = {side: _position_table(weights, side, dim) for side in ("encoder", "decoder")}
    positions = min(t.size(0) for t in tables.values())
    layers = (_count_layers(model, "encoder"), _count_layers(model, "decoder"))
    bias = _biases(model)
    _layers(weights, "encoder", layers[0], state, bias)
    _layers(weights, "decoder", layers[1], state, bias)
    for side in ("encoder", "decoder"):
        if weights.has(f"{side}/layer_norm/gamma"):
            weights.norm(f"{side}/layer_norm", f"{side}.layer_norm", state)
    projection = weights.take("decoder/projection/weight")
    generator = {"weight": projection, "bias": weights.take("decoder/projection/bias")
                 if weights.has("decoder/projection/bias") else torch.zeros(projection.size(0))}
    ff = state["encoder.layers.0.feed_forward.w_1.weight"].size(0)
    opt = _options(model, config, dim, ff, layers, bias, positions)
    unused = _unused(model, weights.used)
    if unused:
        raise CT2Error(f"{path}: variables onmt_lite's Transformer does not use: "
                       f"{', '.join(unused[:3])}{' ...' if len(unused) > 3 else ''}")
    start_zero = bool(model.scalar("decoder/start_from_zero_embedding", 0))
    src_vocab, tgt_vocab, added, src_added = _vocabularies(folder, config, state, generator,
                                                          start_zero, path)
    int8 = _kept_int8(weights, {"encoder.embeddings.embeddings.weight": src_added,
                                "decoder.embeddings.embeddings.weight": len(added),
                                "generator.weight": len(added)})
    return dict(opt=opt, src_vocab=src_vocab, tgt_vocab=tgt_vocab, model_state=state,
                generator_state=generator, origin="ctranslate2",
                tokenizer={"kind": "ctranslate2", "add_source_bos": bool(config["add_source_bos"]),
                           "add_source_eos": bool(config["add_source_eos"]), "absent": added},
                position_tables={side: t[:positions] for side, t in tables.items()},
                int8_weights=int8)


class SourceMarks:
    """Whitespace-split tokens, as translate_batch takes them, with the ``<s>`` and ``</s>``
    that config.json's add_source_bos and add_source_eos add to each source."""

    def __init__(self, bos: Optional[str], eos: Optional[str]):
        self.bos, self.eos = bos, eos

    def encode(self, line: str, side: str = "src") -> List[str]:
        tokens = line.split()
        if side != "src" or not tokens:  # an empty line stays empty (nothing to translate)
            return tokens
        return [self.bos] * bool(self.bos) + tokens + [self.eos] * bool(self.eos)

    def decode(self, pieces: List[str]) -> str:
        return " ".join(pieces)
