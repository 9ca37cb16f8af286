"""NMTModel (encoder + decoder + generator) and build_model(opt)."""
import contextlib
import copy
from typing import Optional, Tuple

import torch
from torch import nn

from onmt_lite.models.rnn import InputFeedRNNDecoder, RNNEncoder
from onmt_lite.models.transformer import (
    ACTIVATIONS,
    POSITION_ENCODINGS,
    TransformerDecoder,
    TransformerEncoder,
)

# Model options and their defaults; a checkpoint's "opt" holds these keys.
MODEL_DEFAULTS = {
    "model_type": "transformer",  # transformer | rnn
    "enc_layers": 3, "dec_layers": 3,
    "hidden_size": 256, "word_vec_size": 256,
    "dropout": 0.1, "attention_dropout": 0.1,
    # rnn
    "rnn_type": "LSTM", "encoder_type": "brnn", "global_attention": "general",
    # transformer
    "heads": 4, "transformer_ff": 1024, "add_qkvbias": False, "add_ffnbias": False,
    "norm_eps": 1e-6, "share_embeddings": False, "share_decoder_embeddings": False,
    "layer_norm_position": "pre",  # pre (OpenNMT-py) | post (Marian)
    "pos_ffn_activation_fn": "relu",  # relu | gelu | gelu-tanh | silu
    "position_encoding_type": "SinusoidalInterleaved",  # or SinusoidalMarian
    "scale_embedding": True, "max_position_embeddings": 5000,
}


class NMTModel(nn.Module):
    """Encoder-decoder with a generator; the three calls a search needs."""

    def __init__(self, encoder: nn.Module, decoder: nn.Module, generator: nn.Linear):
        super().__init__()
        self.encoder, self.decoder, self.generator = encoder, decoder, generator
        # -compile: the encoder, and log_probs of a step's rows, as programs (inference.py)
        self.compiled_encoder = self.compiled_output = None

    def encode(self, src: torch.Tensor, src_len: torch.Tensor) -> Tuple[torch.Tensor, Optional[tuple]]:
        """src (B, S) -> memory (B, S, H) and the encoder's final state (RNN only)."""
        if self.compiled_encoder is not None and not torch.is_grad_enabled():
            return self.compiled_encoder(src, src_len)
        return self.encoder(src, src_len)

    def joinable(self) -> bool:
        """Whether sentences may join its decoder between steps (TransformerDecoder.join)."""
        return getattr(self.decoder, "joinable", lambda: False)()

    def log_probs(self, dec_out: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., V) log-probabilities over the target vocabulary."""
        if self.compiled_output is not None and dec_out.dim() == 2 \
                and not torch.is_grad_enabled():
            return self.compiled_output(dec_out)
        return torch.log_softmax(self.generator(dec_out).float(), dim=-1)

    def forward(self, src, src_len, tgt_in) -> Tuple[torch.Tensor, torch.Tensor]:
        """Teacher forcing: returns log-probs (B, T, V) and attention (B, T, S)."""
        memory, final = self.encode(src, src_len)
        self.decoder.init_state(src_len, memory, final)
        out, attn = self.decoder(tgt_in)
        return self.log_probs(out), attn


def model_options(opt: dict) -> dict:
    """The model options of ``opt``, defaults filled in; unknown model types refused."""
    full = {k: opt.get(k, v) for k, v in MODEL_DEFAULTS.items()}
    if full["model_type"] not in ("rnn", "transformer"):
        raise ValueError(f"unsupported model_type {full['model_type']!r}")
    if full["rnn_type"] not in ("LSTM", "GRU"):
        raise ValueError(f"unsupported rnn_type {full['rnn_type']!r}")
    if full["encoder_type"] not in ("rnn", "brnn"):
        raise ValueError(f"unsupported encoder_type {full['encoder_type']!r}")
    for key, allowed in (("layer_norm_position", ("pre", "post")),
                         ("pos_ffn_activation_fn", ACTIVATIONS),
                         ("position_encoding_type", POSITION_ENCODINGS)):
        if full[key] not in allowed:
            raise ValueError(f"unsupported {key} {full[key]!r}")
    return full


def build_model(opt: dict, src_vocab_size: int, tgt_vocab_size: int, src_pad: int = 1,
                tgt_pad: int = 1) -> NMTModel:
    """Builds an NMTModel from model options (see MODEL_DEFAULTS)."""
    o = model_options(opt)
    if o["model_type"] == "rnn":
        encoder = RNNEncoder(src_vocab_size, src_pad, o["rnn_type"], o["encoder_type"] == "brnn",
                             o["enc_layers"], o["hidden_size"], o["word_vec_size"], o["dropout"])
        decoder = InputFeedRNNDecoder(tgt_vocab_size, tgt_pad, o["rnn_type"], o["dec_layers"],
                                      o["hidden_size"], o["word_vec_size"],
                                      o["global_attention"], o["dropout"])
        if o["share_embeddings"]:
            if src_vocab_size != tgt_vocab_size:
                raise ValueError("share_embeddings needs one vocabulary for source and target")
            decoder.embeddings.weight = encoder.embeddings.weight
    else:
        common = dict(dim=o["hidden_size"], heads=o["heads"], ff_dim=o["transformer_ff"],
                      dropout=o["dropout"], attention_dropout=o["attention_dropout"],
                      qkv_bias=o["add_qkvbias"], ffn_bias=o["add_ffnbias"], eps=o["norm_eps"],
                      activation=o["pos_ffn_activation_fn"],
                      pre_norm=o["layer_norm_position"] == "pre",
                      scale_embedding=o["scale_embedding"],
                      positions=o["position_encoding_type"],
                      max_positions=o["max_position_embeddings"])
        encoder = TransformerEncoder(src_vocab_size, src_pad, o["enc_layers"], **common)
        decoder = TransformerDecoder(tgt_vocab_size, tgt_pad, o["dec_layers"], **common)
        if o["share_embeddings"]:
            if src_vocab_size != tgt_vocab_size:
                raise ValueError("share_embeddings needs one vocabulary for source and target")
            decoder.embeddings.embeddings.weight = encoder.embeddings.embeddings.weight
    generator = nn.Linear(o["hidden_size"], tgt_vocab_size)
    if o["share_decoder_embeddings"]:
        generator.weight = decoder.embeddings.weight
    return NMTModel(encoder, decoder, generator)


def replica(model: NMTModel) -> NMTModel:
    """The same model with its own decoder state (every weight shared), for another thread.

    Decoders keep their state in ``decoder.state`` and ``group`` (the Transformer's also in
    ``cache`` and ``position``), all set by init_state; the layers below them hold none.
    """
    decoder = copy.copy(model.decoder)
    decoder.state = {}
    if getattr(decoder, "cache", None) is not None:
        decoder.cache = None  # never share a cache; init_state makes the twin's own
    twin = copy.copy(model)
    twin._modules = dict(model._modules, decoder=decoder)
    if "decoder" in vars(twin):  # pinned (pin_submodules)
        vars(twin)["decoder"] = decoder
    return twin


def pin_submodules(model: nn.Module) -> None:
    """Puts every submodule in its parent's instance dictionary too, where Python looks first.
    nn.Module keeps them in ``_modules``, reached through its ``__getattr__``: a Python call at
    every ``self.layer``, some 130 a step of the Argos package's three layers (a lone
    sentence, one thread: 9.3-9.7 ms pinned against 10.6-11.0). A submodule replaced through
    setattr (swap.py) drops its pinned entry; weights stay where nn.Module keeps them (a move
    to another device or type makes new buffers)."""
    for module in model.modules():
        vars(module).update(module._modules)


@contextlib.contextmanager
def inference():
    """torch.inference_mode with the __torch_function__ overrides of subclasses turned off.

    An int8 product takes its packed weights as a TorchScript object, and torch looks for such
    an override on it at every call: an attribute error raised and caught in C++, ~13 us a
    product (a third of a 160-row product, three quarters of a one-row one). Decoding uses no
    tensor subclass, so nothing else changes.
    """
    with torch.inference_mode(), torch._C.DisableTorchFunctionSubclass():
        yield
