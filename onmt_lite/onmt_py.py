"""OpenNMT-py 3.x checkpoints: option and weight-name mapping to onmt_lite models.

Every option that changes the computation is checked; a value onmt_lite does not implement is
refused by name rather than ignored.
"""
import argparse
import re

from onmt_lite import transforms
from onmt_lite.vocab import Vocab


def is_onmt_py(data: dict) -> bool:
    """OpenNMT-py 3.x keeps its options in an argparse.Namespace."""
    return {"model", "generator", "vocab", "opt"} <= set(data) and isinstance(
        data["opt"], argparse.Namespace)


def _first(value):
    return value[0] if isinstance(value, (list, tuple)) else value


# option -> the values onmt_lite implements (a missing option counts as its 3.5.1 default)
SUPPORTED = {
    "model_type": ("text",), "data_task": ("seq2seq",),
    "encoder_type": ("rnn", "brnn", "transformer"), "decoder_type": ("rnn", "transformer"),
    "rnn_type": ("LSTM", "GRU"), "global_attention": ("dot", "general", "mlp"),
    "global_attention_function": ("softmax",), "generator_function": ("softmax",),
    "input_feed": (1,), "bridge": (False,), "context_gate": (None,), "copy_attn": (False,),
    "coverage_attn": (False,), "layer_norm": ("standard",), "max_relative_positions": (0,),
    "position_encoding_type": ("SinusoidalInterleaved",), "pos_ffn_activation_fn": ("relu",),
    "parallel_residual": (False,), "num_kv": (0,), "multiquery": (False,),
    "num_experts": (0,), "sliding_window": (0,), "lambda_align": (0.0,),
    "decoder_start_token": ("<s>",), "self_attn_type": ("scaled-dot", "scaled-dot-flash"),
    "src_feats": (None, {}), "rotary_dim": (0,), "relative_positions_buckets": (0,),
}


def convert_options(opt: dict) -> dict:
    """OpenNMT-py options -> onmt_lite model options; ValueError names an unsupported option."""
    for name, allowed in SUPPORTED.items():
        if name in opt and opt[name] not in allowed:
            raise ValueError(f"OpenNMT-py option {name}={opt[name]!r} is not supported "
                             f"(supported: {', '.join(map(repr, allowed))})")
    enc, dec = opt.get("encoder_type", "rnn"), opt.get("decoder_type", "rnn")
    is_rnn = dec == "rnn"
    if is_rnn != (enc in ("rnn", "brnn")):
        raise ValueError(f"OpenNMT-py option encoder_type={enc!r} with decoder_type={dec!r} "
                         "is not supported")
    if not is_rnn and not opt.get("position_encoding", False):
        raise ValueError("OpenNMT-py option position_encoding=False is not supported "
                         "for Transformers")
    if is_rnn and opt.get("position_encoding", False):
        raise ValueError("OpenNMT-py option position_encoding=True is not supported for RNNs")
    out = {
        "model_type": "rnn" if is_rnn else "transformer",
        "enc_layers": opt["enc_layers"], "dec_layers": opt["dec_layers"],
        "hidden_size": opt["hidden_size"], "word_vec_size": opt["word_vec_size"],
        "dropout": _first(opt.get("dropout", 0.3)),
        "attention_dropout": _first(opt.get("attention_dropout", 0.1)),
        "share_embeddings": bool(opt.get("share_embeddings", False)),
        "share_decoder_embeddings": bool(opt.get("share_decoder_embeddings", False)),
    }
    if is_rnn:
        out.update(rnn_type=opt.get("rnn_type", "LSTM"), encoder_type=enc,
                   global_attention=opt.get("global_attention", "general"))
    else:
        out.update(heads=opt["heads"], transformer_ff=opt["transformer_ff"],
                   add_qkvbias=bool(opt.get("add_qkvbias", False)),
                   add_ffnbias=bool(opt.get("add_ffnbias", False)),
                   norm_eps=opt.get("norm_eps", 1e-6))
    return out


_RENAMES = [
    (re.compile(r"^(encoder|decoder)\.embeddings\.make_embedding\.emb_luts\.0\.weight$"), None),
    (re.compile(r"^encoder\.transformer\.(\d+)\."), r"encoder.layers.\1."),
    (re.compile(r"^decoder\.transformer_layers\.(\d+)\."), r"decoder.layers.\1."),
]
_POSITION_TABLE = re.compile(r"\.make_embedding\.pe\.pe$")


def convert_weights(state: dict, model_type: str) -> dict:
    """Renames OpenNMT-py weights; drops the fixed position tables (recomputed on load)."""
    out = {}
    embedding = "embeddings.weight" if model_type == "rnn" else "embeddings.embeddings.weight"
    for name, tensor in state.items():
        if _POSITION_TABLE.search(name):
            continue
        match = _RENAMES[0][0].match(name)
        if match:
            name = f"{match.group(1)}.{embedding}"
        for pattern, repl in _RENAMES[1:]:
            name = pattern.sub(repl, name)
        out[name] = tensor
    return out


def convert(data: dict):
    """An OpenNMT-py 3.x checkpoint -> (opt, src Vocab, tgt Vocab, model state, generator state)."""
    opt = data["opt"]
    opt = dict(vars(opt)) if not isinstance(opt, dict) else dict(opt)
    vocab = data["vocab"]
    if not isinstance(vocab, dict) or not all(isinstance(vocab.get(side), list)
                                              for side in ("src", "tgt")):
        raise ValueError("OpenNMT-py vocabulary is not in the 3.x format (lists of tokens)")
    try:
        options = convert_options(opt)
    except KeyError as err:
        raise ValueError(f"OpenNMT-py options lack {err.args[0]!r}") from None
    if not isinstance(data["generator"], dict) or not isinstance(data["model"], dict):
        raise ValueError("OpenNMT-py checkpoint has no model/generator state dicts")
    # the subword transforms it was trained with, applied at translation time (transforms.py)
    options.update({key: opt[key] for key in transforms.OPTIONS if opt.get(key)})
    return (options, Vocab(vocab["src"]), Vocab(vocab["tgt"]),
            convert_weights(data["model"], options["model_type"]), dict(data["generator"]))
