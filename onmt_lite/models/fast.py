"""The fast path (``-fast``, ``-compile``): the Transformer decoder's step rebuilt for speed,
judged by BLEU and by the share of lines identical to exact decoding rather than by equality.

- One product for each self-attention's queries, keys and values (its three weights side by
  side, the query scale folded in).
- A step's self-attention over fewer than 8 cached positions by elementwise products and sums:
  batched matrix products of one query row with so few keys take 3-4x longer (MKL).
- With ``-int8``, the RNN's LSTM and GRU cells quantised as well as its linear layers (see
  model.for_inference).
- With ``-compile``, the position-wise blocks between the attentions compiled by
  ``torch.compile`` (Inductor) where a C++ compiler is found: with dynamic shapes, so one
  compilation serves every number of rows and every length; the code is kept in a cache
  directory, so a later process loads it instead of compiling. Without a compiler the same
  blocks run uncompiled, after one line that says so.
"""
import logging
import math
import os
import shutil
import sys
from typing import Callable, Optional

import torch
from torch import nn

from onmt_lite.models.transformer import DecoderLayer, Residual, TransformerDecoder

logger = logging.getLogger("onmt_lite")

FEW_KEYS = 8  # below this many keys one query row's attention goes elementwise

DEFAULT_CACHE = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")),
                             "onmt_lite", "compiled")
# the user's choice, read before Inductor's import sets the variable to its own default
USER_CACHE = os.environ.get("TORCHINDUCTOR_CACHE_DIR")


def compiler_problem() -> Optional[str]:
    """Why torch.compile cannot build CPU code here, or None if it can. Inductor (2 s to import)
    is imported only where its compiler is found: its own setting if it is loaded, else its
    default, $CXX or g++ (clang++ on macOS)."""
    config = sys.modules.get("torch._inductor.config")
    if config is not None:
        cxx = config.cpp.cxx
        candidates = [c for c in (cxx if isinstance(cxx, (list, tuple)) else (cxx,)) if c]
    else:
        candidates = [os.environ.get("CXX", "clang++" if sys.platform == "darwin" else "g++")]
    if not any(shutil.which(c) for c in candidates):
        return f"no C++ compiler found (looked for {', '.join(candidates)}; set CXX to one)"
    try:
        import torch._inductor.config  # noqa: F401
    except ImportError as err:  # a torch build without Inductor
        return f"this torch build has no Inductor compiler ({err})"
    return None


def compiler(cache_dir: str = "") -> Callable:
    """torch.compile with dynamic shapes and its code kept in ``cache_dir`` (default: the user's
    cache); where no compiler is found, says so in one line and returns the eager function."""
    problem = compiler_problem()
    if problem:
        logger.warning("-compile: %s: the decoder step runs uncompiled", problem)
        return lambda fn: fn
    directory = os.path.abspath(cache_dir or USER_CACHE or DEFAULT_CACHE)
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR") != directory:
        from torch._inductor.utils import clear_caches
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = directory
        clear_caches()  # nothing compiled before is looked for in the old place
    return lambda fn: torch.compile(fn, dynamic=True)


class FastDecoderLayer(Residual):
    """A DecoderLayer's step on the fast path, with the layer's own modules (weights shared).

    Args:
        layer: the DecoderLayer.
        compile: turns a block function into its compiled version (see ``compiler``).
    """

    def __init__(self, layer: DecoderLayer, compile: Callable = lambda fn: fn):
        super().__init__(layer.pre_norm)
        self.layer_norm_1, self.layer_norm_2 = layer.layer_norm_1, layer.layer_norm_2
        self.self_attn, self.context_attn = layer.self_attn, layer.context_attn
        self.feed_forward = layer.feed_forward
        attn = layer.self_attn
        parts = (attn.linear_query, attn.linear_keys, attn.linear_values)
        scales = (1 / math.sqrt(attn.dim_per_head), 1.0, 1.0)  # 1/8 for 64 per head: exact
        self.qkv = nn.Linear(parts[0].in_features, 3 * parts[0].out_features,
                             bias=parts[0].bias is not None, device=parts[0].weight.device,
                             dtype=parts[0].weight.dtype)
        with torch.no_grad():
            self.qkv.weight.copy_(torch.cat([p.weight * k for p, k in zip(parts, scales)]))
            if self.qkv.bias is not None:
                self.qkv.bias.copy_(torch.cat([p.bias * k for p, k in zip(parts, scales)]))
        self.project, self.between, self.finish = (
            compile(self._project), compile(self._between), compile(self._finish))

    def _project(self, x: torch.Tensor):
        """x (B, T, H) -> scaled queries, keys, values (B, h, T, d) each."""
        qkv = self.qkv(self.before(self.layer_norm_1, x))
        return tuple(self.self_attn.split_heads(part) for part in qkv.chunk(3, dim=-1))

    def _between(self, context: torch.Tensor, x: torch.Tensor):
        """The self-attention's contexts (B, T, H) -> the layer's state after it and the
        context attention's scaled queries."""
        query = self.after(self.layer_norm_1, self.self_attn.final_linear(context) + x)
        return query, self.context_attn.project_query(self.before(self.layer_norm_2, query))

    def _finish(self, context: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        out = self.context_attn.final_linear(context)
        return self.feed_forward(self.after(self.layer_norm_2, out + query))

    def self_attention(self, q, keys, values, mask) -> torch.Tensor:
        """Contexts (B, h, T, d) of scaled queries q over keys/values (B, h, S, d)."""
        if q.size(2) == 1 and keys.size(2) < FEW_KEYS:  # one step: no mask
            weights = torch.softmax((q * keys).sum(-1, keepdim=True), dim=2)  # (B, h, S, 1)
            return (weights * values).sum(2, keepdim=True)
        return self.self_attn.attention(q, keys, values, mask)[0]

    def forward(self, x, cache, index: int, self_mask, mem_kv, src_mask, group: int):
        """As DecoderLayer.forward."""
        rows, length = x.size(0), x.size(1)  # the compiled blocks see contiguous (B, T, H)
        q, keys, values = self.project(x)
        if cache is not None:
            keys, values = cache.append(index, keys, values)
        context = self.self_attention(q, keys, values, self_mask)
        query, q = self.between(self.self_attn.merge_heads(context, rows, length), x)
        context, attn = self.context_attn.attention(q, *mem_kv, src_mask, group)
        return self.finish(self.context_attn.merge_heads(context, rows, length), query), attn


def to_fast(decoder: nn.Module, compile: bool = False, cache_dir: str = "") -> nn.Module:
    """Puts a TransformerDecoder's layers on the fast path, in place, compiled if ``compile``;
    returns the decoder. Other decoders (RNN) are returned as they are:
    their step has no such rewrite."""
    if isinstance(decoder, TransformerDecoder):
        compile = compiler(cache_dir) if compile else (lambda fn: fn)
        decoder.layers = nn.ModuleList(FastDecoderLayer(layer, compile)
                                       for layer in decoder.layers)
    return decoder
