"""Transformer encoder and incremental decoder: OpenNMT-py's pre-norm layout, and the post-norm
layout of Marian (Hugging Face ``MarianMTModel``) with the same modules in other places."""
import math
from typing import Dict, Optional, Tuple, Union

import torch
from torch import nn
from torch.nn import functional as F

from onmt_lite.models.attention import MultiHeadedAttention
from onmt_lite.models.kv_cache import KVCache
from onmt_lite.models.rnn import padding_mask
from onmt_lite.models.state import StateFn, map_state, new_state

ACTIVATIONS = {"relu": torch.relu, "gelu": nn.functional.gelu, "silu": nn.functional.silu,
               "gelu-tanh": lambda x: nn.functional.gelu(x, approximate="tanh")}
POSITION_ENCODINGS = ("SinusoidalInterleaved", "SinusoidalMarian")


def sinusoidal_table(max_len: int, dim: int, kind: str = "SinusoidalInterleaved") -> torch.Tensor:
    """(max_len, dim) sin/cos position encodings: interleaved (OpenNMT-py), or Marian's sines
    then cosines, computed as ``transformers`` does (float64, then float32)."""
    if kind == "SinusoidalMarian":
        j = torch.arange(dim, dtype=torch.float64)
        angle = torch.arange(max_len, dtype=torch.float64).unsqueeze(1) / torch.pow(
            10000.0, 2 * torch.div(j, 2, rounding_mode="floor") / dim)
        return torch.cat([torch.sin(angle[:, 0::2]), torch.cos(angle[:, 1::2])], 1).float()
    position = torch.arange(max_len, dtype=torch.float).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, dim, 2, dtype=torch.float) * -(math.log(10000.0) / dim))
    table = torch.zeros(max_len, dim)
    table[:, 0::2] = torch.sin(position * div_term)
    table[:, 1::2] = torch.cos(position * div_term)
    return table


class PositionalEmbeddings(nn.Module):
    """Word embeddings scaled by sqrt(dim) (unless ``scale`` is off), plus sinusoidal
    positions, then dropout."""

    def __init__(self, vocab_size: int, dim: int, pad: int, dropout: float, scale: bool = True,
                 positions: str = "SinusoidalInterleaved", max_len: int = 5000):
        super().__init__()
        self.dim, self.max_len = dim, max_len
        self.scale = math.sqrt(dim) if scale else 1.0
        self.embeddings = nn.Embedding(vocab_size, dim, padding_idx=pad)
        self.register_buffer("pe", sinusoidal_table(max_len, dim, positions), persistent=False)
        self.dropout = nn.Dropout(dropout)

    @property
    def weight(self) -> torch.Tensor:
        return self.embeddings.weight

    def forward(self, tokens: torch.Tensor, start: Union[int, torch.Tensor] = 0) -> torch.Tensor:
        """tokens (B, T) at positions start.. -> (B, T, dim); ``start`` (B,): each row's own
        (T = 1)."""
        at = start if isinstance(start, int) else int(start.max())
        if at + tokens.size(1) > self.max_len:
            raise ValueError(f"sequence longer than {self.max_len} positions")
        emb = self.embeddings(tokens) * self.scale
        pe = self.pe[start:start + tokens.size(1)] if isinstance(start, int) \
            else self.pe.index_select(0, start).unsqueeze(1)
        return self.dropout(emb + pe)


class Residual(nn.Module):
    """A block with residual connections whose layer norms act on each sub-layer's input
    (pre-norm, OpenNMT-py) or on its output plus residual (post-norm, Marian)."""

    def __init__(self, pre_norm: bool):
        super().__init__()
        self.pre_norm = pre_norm

    def before(self, norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return norm(x) if self.pre_norm else x

    def after(self, norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return x if self.pre_norm else norm(x)


class FeedForward(Residual):
    """Position-wise feed-forward block with its residual connection."""

    def __init__(self, dim: int, ff_dim: int, dropout: float, bias: bool, eps: float,
                 activation: str = "relu", pre_norm: bool = True):
        super().__init__(pre_norm)
        self.activation = ACTIVATIONS[activation]
        self.layer_norm = nn.LayerNorm(dim, eps=eps)
        self.w_1 = nn.Linear(dim, ff_dim, bias=bias)
        self.w_2 = nn.Linear(ff_dim, dim, bias=bias)
        self.dropout_1 = nn.Dropout(dropout)
        self.dropout_2 = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inter = self.dropout_1(self.activation(self.w_1(self.before(self.layer_norm, x))))
        return self.after(self.layer_norm, self.dropout_2(self.w_2(inter)) + x)


class EncoderLayer(Residual):
    def __init__(self, dim, heads, ff_dim, dropout, attention_dropout, qkv_bias, ffn_bias, eps,
                 activation="relu", pre_norm=True):
        super().__init__(pre_norm)
        self.layer_norm = nn.LayerNorm(dim, eps=eps)
        self.self_attn = MultiHeadedAttention(heads, dim, attention_dropout, qkv_bias)
        self.feed_forward = FeedForward(dim, ff_dim, dropout, ffn_bias, eps, activation, pre_norm)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        normed = self.before(self.layer_norm, x)
        keys, values = self.self_attn.project_kv(normed)
        context, _ = self.self_attn.attend(normed, keys, values, mask)
        return self.feed_forward(self.after(self.layer_norm, self.dropout(context) + x))


class TransformerEncoder(nn.Module):
    def __init__(self, vocab_size, pad, layers, dim, heads, ff_dim, dropout, attention_dropout,
                 qkv_bias=False, ffn_bias=False, eps=1e-6, activation="relu", pre_norm=True,
                 scale_embedding=True, positions="SinusoidalInterleaved", max_positions=5000):
        super().__init__()
        self.embeddings = PositionalEmbeddings(vocab_size, dim, pad, dropout, scale_embedding,
                                               positions, max_positions)
        self.layers = nn.ModuleList(
            EncoderLayer(dim, heads, ff_dim, dropout, attention_dropout, qkv_bias, ffn_bias, eps,
                         activation, pre_norm)
            for _ in range(layers))
        # pre-norm ends with a normalisation; post-norm layers already end with one
        self.layer_norm = nn.LayerNorm(dim, eps=eps) if pre_norm else nn.Identity()

    def forward(self, src: torch.Tensor, src_len: torch.Tensor):
        """src (B, S) -> memory (B, S, H); no final state."""
        mask = padding_mask(src_len, src.size(1)).unsqueeze(1)  # (B, 1, 1, S)
        x = self.embeddings(src)
        for layer in self.layers:
            x = layer(x, mask)
        return self.layer_norm(x), None


class DecoderLayer(Residual):
    def __init__(self, dim, heads, ff_dim, dropout, attention_dropout, qkv_bias, ffn_bias, eps,
                 activation="relu", pre_norm=True):
        super().__init__(pre_norm)
        self.layer_norm_1 = nn.LayerNorm(dim, eps=eps)
        self.self_attn = MultiHeadedAttention(heads, dim, attention_dropout, qkv_bias)
        self.layer_norm_2 = nn.LayerNorm(dim, eps=eps)
        self.context_attn = MultiHeadedAttention(heads, dim, attention_dropout, qkv_bias)
        self.feed_forward = FeedForward(dim, ff_dim, dropout, ffn_bias, eps, activation, pre_norm)
        self.dropout = nn.Dropout(dropout)

    def memory_kv(self, memory: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The context attention's keys and values of the memory, as ``forward`` takes them."""
        return self.context_attn.project_kv(memory)

    def source_mask(self, mask: torch.Tensor) -> torch.Tensor:
        """The source mask (B, 1, 1, S), True at padding, as ``forward`` takes it."""
        return mask

    def pad_source(self, entry: torch.Tensor, width: int, kind: str) -> torch.Tensor:
        """A source entry padded to ``width`` source positions (sentences joining a search,
        TransformerDecoder.join): the ``mask`` from source_mask with True (masked), the memory's
        ``keys`` or ``values`` (B, h, S, d) from memory_kv with zeros."""
        if entry.size(-1 if kind == "mask" else 2) == width:
            return entry  # F.pad would copy it
        if kind == "mask":
            return F.pad(entry, (0, width - entry.size(-1)), value=True)
        return F.pad(entry, (0, 0, 0, width - entry.size(2)))

    def forward(self, x, cache: Optional[KVCache], index: int, self_mask, mem_kv, src_mask,
                group: int):
        """x (B, T, H) attends to the cached prefix plus itself, and to ``mem_kv`` (one row per
        ``group`` rows of x).

        Writes its keys/values into layer ``index`` of ``cache`` (without a cache, x is the whole
        sequence); returns the output (B, T, H) and the context attention (B / group, h,
        group * T, S).
        """
        normed = self.before(self.layer_norm_1, x)
        keys, values = self.self_attn.project_kv(normed)
        if cache is not None:
            keys, values = cache.append(index, keys, values)
        self_out, _ = self.self_attn.attend(normed, keys, values, self_mask)
        query = self.after(self.layer_norm_1, self.dropout(self_out) + x)
        ctx, attn = self.context_attn.attend(self.before(self.layer_norm_2, query), *mem_kv,
                                             src_mask, group)
        out = self.after(self.layer_norm_2, self.dropout(ctx) + query)
        return self.feed_forward(out), attn


class TransformerDecoder(nn.Module):
    """Decoder with a key/value cache per layer, so a step costs O(length)."""

    def __init__(self, vocab_size, pad, layers, dim, heads, ff_dim, dropout, attention_dropout,
                 qkv_bias=False, ffn_bias=False, eps=1e-6, activation="relu", pre_norm=True,
                 scale_embedding=True, positions="SinusoidalInterleaved", max_positions=5000):
        super().__init__()
        self.embeddings = PositionalEmbeddings(vocab_size, dim, pad, dropout, scale_embedding,
                                               positions, max_positions)
        self.layers = nn.ModuleList(
            DecoderLayer(dim, heads, ff_dim, dropout, attention_dropout, qkv_bias, ffn_bias, eps,
                         activation, pre_norm)
            for _ in range(layers))
        self.layer_norm = nn.LayerNorm(dim, eps=eps) if pre_norm else nn.Identity()
        self.state: Dict[str, torch.Tensor] = {}
        self.cache: Optional[KVCache] = None  # the self-attention keys/values (init_state)
        self.group = 1  # decoder rows per row of the source entries (see state.py)
        self.position = 0
        self.compiled_step = None  # -compile: the step compiled whole (compiled_step.py)
        self.source_keys = ["src_mask"] + [f"memory_{kv}.{i}" for i in range(layers)
                                           for kv in ("keys", "values")]

    def init_state(self, src_len: torch.Tensor, memory: torch.Tensor, final=None) -> None:
        """Projects the memory keys/values once per sentence; empties the self-attention cache."""
        self.position = 0
        self.state = new_state(memory.size(0), memory.device)
        self.state["src_mask"] = self.layers[0].source_mask(  # the same for every layer
            padding_mask(src_len, memory.size(1)).unsqueeze(1))
        for i, (keys, values) in enumerate(self.memory_kv(memory)):
            self.state[f"memory_keys.{i}"] = keys
            self.state[f"memory_values.{i}"] = values
        self.group = 1
        attn = self.layers[0].self_attn
        self.cache = KVCache(len(self.layers), memory.size(0), attn.heads, attn.dim_per_head,
                             memory.dtype, memory.device,
                             zeroed=self.compiled_step is not None,  # it reads capacity
                             tight=self.compiled_step is not None  # at every step's rows
                             and not self.compiled_step.few_rows_only)

    def memory_kv(self, memory: torch.Tensor):
        """Each layer's context keys and values of ``memory`` (B, S, H), as the layer makes
        them (by one program with -compile)."""
        step = self.compiled_step
        if step is not None and step.memory_program is not None and not torch.is_grad_enabled():
            return step.memory_kv(memory)
        return [layer.memory_kv(memory) for layer in self.layers]

    def tiles_first_step(self, sentences: int) -> bool:
        """Whether a beam's first step runs on every hypothesis' row, not one a sentence
        (search/loop.py): with -compile, where its program says so (CompiledStep)."""
        return self.compiled_step is not None and self.compiled_step.tiles_first_step(sentences)

    def map_state(self, fn: StateFn) -> None:
        """Applies ``fn(tensor, batch_dim)``, a selection of rows, to the decoder's state (see
        state.py); the self-attention cache follows it (see kv_cache.py)."""
        mapped = map_state(self.state, fn, {}, self.source_keys, self.group)
        self.cache.reorder(fn(self.cache.slot, 0), mapped.group)
        self.state, self.group = mapped.state, mapped.group

    def joinable(self) -> bool:
        """Whether ``join`` may add sentences: its layers say how to pad their source entries
        (the plain and the fast layers, compiled or not)."""
        return all(hasattr(layer, "pad_source") for layer in self.layers)

    def join(self, src_len: torch.Tensor, memory: torch.Tensor, rows: int) -> None:
        """Adds sentences, ``rows`` decoder rows each, at position 0 beside the rows decoding
        (a search that sentences join between steps, search/loop.py). From then on each row
        has a position of its own (state ``positions``), its self-attention masked past it;
        sources are padded to the longest."""
        s, layers = self.state, self.layers
        count = src_len.size(0)
        if "positions" not in s:
            s["positions"] = torch.full_like(s["sentence"], self.position)
            self.cache.own_positions()
        width = max(s["src_mask"].size(-1), memory.size(1))
        per_source = 1 if self.group == rows else rows  # source entries: one a sentence or row

        def add(key: str, layer, kind: str, entry: torch.Tensor) -> None:
            s[key] = torch.cat([layer.pad_source(s[key], width, kind), layer.pad_source(
                entry, width, kind).repeat_interleave(per_source, dim=0)])
        add("src_mask", layers[0], "mask",
            layers[0].source_mask(padding_mask(src_len, memory.size(1)).unsqueeze(1)))
        for i, (layer, (keys, values)) in enumerate(zip(layers, self.memory_kv(memory))):
            add(f"memory_keys.{i}", layer, "keys", keys)
            add(f"memory_values.{i}", layer, "values", values)
        first = int(s["sentence"].max()) + 1 if s["sentence"].numel() else 0
        s["sentence"] = torch.cat([s["sentence"], torch.arange(
            first, first + count, device=memory.device).repeat_interleave(rows)])
        s["positions"] = torch.cat([s["positions"], s["positions"].new_zeros(count * rows)])
        self.cache.add_rows(count * rows)

    def _inputs(self, tgt: torch.Tensor, cache: Optional[KVCache]):
        """``tgt`` (B, T) embedded at its positions (in the cache's row order) and the
        self-attention mask (True = masked); the cache made ready to take T positions."""
        length, positions = tgt.size(1), self.state.get("positions")
        if cache is not None:
            tgt = cache.to_buffer(tgt)
            if positions is not None:  # rows at positions of their own: one step
                at = cache.to_buffer(positions)
                cache.length = int(at.max())  # the columns the furthest row has written
                cache.reserve(1)
                cache.at = at
                mask = torch.arange(cache.length + 1, device=tgt.device) > at.unsqueeze(1)
                return self.embeddings(tgt, start=at), mask.view(tgt.size(0), 1, 1, -1)
            cache.reserve(length)
        x = self.embeddings(tgt, start=self.position)
        total = self.position + length
        self_mask = None if length == 1 else torch.ones(  # True above the diagonal = future
            length, total, dtype=torch.bool, device=tgt.device).triu_(self.position + 1)
        return x, self_mask

    def _advance(self, length: int) -> None:
        """The position(s) after a step of ``length`` tokens."""
        self.position += length
        if "positions" in self.state:
            self.state["positions"] = self.state["positions"] + length
        if self.cache is not None and not torch.is_grad_enabled():
            self.cache.advance(length)

    def forward(self, tgt: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Decodes ``tgt`` (B, T) after the cached prefix; returns (B, T, H) and (B, T, S).

        Self-attention is causal over the cached prefix and ``tgt``; the cache grows by T.
        Under autograd (training) ``tgt`` must be the whole sequence and the cache is left out:
        its in-place writes would overwrite what the backward pass needs.
        """
        s, length = self.state, tgt.size(1)
        cache = None if torch.is_grad_enabled() else self.cache
        if cache is None and self.position > 0:
            raise RuntimeError("incremental decoding (a step after the first) needs "
                               "torch.no_grad() or torch.inference_mode()")
        x, self_mask = self._inputs(tgt, cache)
        attn = None
        for i, layer in enumerate(self.layers):
            memory_kv = (s[f"memory_keys.{i}"], s[f"memory_values.{i}"])
            x, attn = layer(x, cache, i, self_mask, memory_kv, s["src_mask"], self.group)
        self._advance(length)
        # head 0 of the last layer's context attention, as OpenNMT-py reports
        attn = attn[:, 0].reshape(tgt.size(0), length, -1)
        if cache is None:
            return self.layer_norm(x), attn
        return cache.from_buffer(self.layer_norm(x)), cache.from_buffer(attn)

    def step(self, tokens: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """One decoding step: tokens (B,) -> output (B, H), attention (B, S)."""
        step = self.compiled_step
        if step is not None and step.takes(tokens.size(0)) and not torch.is_grad_enabled():
            return step(self, tokens)
        out, attn = self.forward(tokens.unsqueeze(1))
        return out.squeeze(1), attn.squeeze(1)
