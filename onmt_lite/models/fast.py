"""The fast path (``-fast``, ``-compile``): the decoder's step rebuilt for speed, judged by BLEU
and by the share of lines identical to exact decoding rather than by equality. Products and norms
are called as functions (``product``, ``layer_norm``), not through their modules: at a step's
few rows the module machinery costs as much as the product.

Transformer:
- One product for each self-attention's queries, keys and values (its three weights side by
  side, the query scale folded in); the context attention's query scale folded in too.
- A step's self-attention over fewer than 8 cached positions by elementwise products and sums:
  batched matrix products of one query row with so few keys take 3-4x longer (MKL); over more,
  for at most 8 rows (a lone sentence), by torch's fused scaled_dot_product_attention (0.5-0.9x
  the time of the products and softmax at 4-8 rows; slower from 16 rows on).
- The context attention's keys kept transposed (B, h, d, S), the source mask kept as a bias
  and added inside the scores' product (``baddbmm``), both made once per batch: 15-30% less
  time than a product with transposed keys and a separate masking pass (32 sentences x 5
  hypotheses, 8-30 source tokens).
- The first feed-forward product and its relu in one int8 call (``linear_relu_dynamic``).
- With ``-compile``, the whole step exported and compiled ahead of time by AOTInductor where a
  C++ compiler is found (compiled_step.py), and so are the encoder (its layers as
  FastEncoderLayers) and the decoder layers' products with the memory; the packages are kept
  in a cache directory, so a later process loads them instead of compiling. Without a
  compiler the model runs uncompiled, after one line that says so. With ``-int8`` only the
  steps of a few rows run a program (CompiledStep's ``few_rows_only``).

RNN (input feeding), a sixth fewer multiply-adds a step on the fixture, each fold exact up to
rounding:
- the first cell's product with the embedding looked up in a table made at load (one row per
  target word: its embedding's product plus the biases), at most MAX_TABLE_BYTES;
- each LSTM cell above it: one product over its input and hidden state side by side, not two;
- the attention's products with the memory made once per batch, not once per step: the
  ``general`` score's query projection moved onto the memory ((W q).m = q.(W^T m)), and the
  output projection's context half, since the context is a weighted sum of memory rows;
- tanh computed from a sigmoid (``sigmoid_tanh``);
- with ``-int8``, the decoder's cells and the encoder's LSTM or GRU quantised as well as the
  linear layers (see inference.for_inference).
"""
import math
from typing import Optional, Tuple

import torch
from torch import nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear

from onmt_lite.constants import MASKED_LOGIT
from onmt_lite.models.attention import GlobalAttention, masked_bias
from onmt_lite.models.int8 import INT8_LINEAR, INT8_LINEAR_RELU
from onmt_lite.models.onednn import OneDNNLinear
from onmt_lite.models.rnn import InputFeedRNNDecoder, gru_update, lstm_update
from onmt_lite.models.transformer import (
    DecoderLayer,
    EncoderLayer,
    Residual,
    TransformerDecoder,
)

FEW_KEYS = 8  # below this many keys one query row's attention goes elementwise
FEW_ROWS = 8  # at most this many rows (a lone sentence), one fused call (scaled_dot_product)
MAX_TABLE_BYTES = 256 << 20  # the RNN's embedding products: V x 4H floats (LSTM)


def _linear(weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> nn.Linear:
    """An nn.Linear holding copies of ``weight`` (out, in) and ``bias`` (quantised by -int8)."""
    linear = nn.Linear(weight.size(1), weight.size(0), bias=bias is not None,
                       device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        linear.weight.copy_(weight)
        if bias is not None:
            linear.bias.copy_(bias)
    return linear


def product(linear: nn.Module, x: torch.Tensor, relu: bool = False,
            bf16: bool = False) -> torch.Tensor:
    """``linear(x)`` (then relu) without the module call: 10-15 us less a product at a step's
    few rows (F.linear on an nn.Linear's weights, torch's int8 op on a -int8 layer's packed
    weights and oneDNN's on a OneDNNLinear's, with the relu inside them). ``bf16``: the product
    of x and the weight rounded to bf16, its result and the bias in fp32, as Bfloat16Linear makes
    it (in the compiled step, where the weight's rounding is folded into a constant)."""
    kind = type(linear)
    if bf16 and kind is nn.Linear:
        out = nn.functional.linear(x.to(torch.bfloat16), linear.weight.to(torch.bfloat16))
        out = out.float() if linear.bias is None else out.float() + linear.bias
        return torch.relu(out) if relu else out
    if issubclass(kind, DynamicQuantizedLinear) and linear._packed_params.dtype == torch.qint8:
        return (INT8_LINEAR_RELU if relu else INT8_LINEAR)(
            x, linear._packed_params._packed_params, True)
    if issubclass(kind, OneDNNLinear):  # bf16 or fp32 weights, the relu inside the product
        return linear.forward(x, relu)
    out = nn.functional.linear(x, linear.weight, linear.bias) if kind is nn.Linear else linear(x)
    return torch.relu_(out) if relu else out


def sigmoid_tanh(x: torch.Tensor) -> torch.Tensor:
    """tanh(x) as 2 sigmoid(2x) - 1, within 2e-7: on a CPU twice as fast as torch's tanh, which
    takes 3x its sigmoid's time (160 x 256: 68 against 135 us)."""
    if x.device.type != "cpu":
        return torch.tanh(x)
    return torch.sigmoid(x * 2).mul_(2).sub_(1)


def layer_norm(norm: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    return torch.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


def _fused_qkv(attn) -> nn.Linear:
    """One product for a self-attention's queries, keys and values, the query scale folded in
    (1/8 for 64 dimensions a head: exact)."""
    scale = 1 / math.sqrt(attn.dim_per_head)
    parts = (attn.linear_query, attn.linear_keys, attn.linear_values)
    return _linear(torch.cat([p.weight * k for p, k in zip(parts, (scale, 1, 1))]),
                   None if parts[0].bias is None
                   else torch.cat([p.bias * k for p, k in zip(parts, (scale, 1, 1))]))


class FastResidual(Residual):
    """Residual with its norms called as functions, and the feed-forward block of a fast layer
    (``bf16``: see product)."""

    def before(self, norm: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:  # as Residual's
        return layer_norm(norm, x) if self.pre_norm else x

    def after(self, norm: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
        return x if self.pre_norm else layer_norm(norm, x)

    def feed_forward_block(self, x: torch.Tensor, bf16: bool) -> torch.Tensor:
        ff, normed = self.feed_forward, self.before(self.feed_forward.layer_norm, x)
        if ff.activation is torch.relu:
            inner = product(ff.w_1, normed, relu=True, bf16=bf16)
        else:
            inner = ff.activation(product(ff.w_1, normed, bf16=bf16))
        return self.after(ff.layer_norm, product(ff.w_2, inner, bf16=bf16) + x)


class FastEncoderLayer(FastResidual):
    """An EncoderLayer with the layer's own modules (weights shared), called as FastDecoderLayer
    calls a decoder layer's, the padding a bias added to the scores: the blocks of the
    compiled encoder (compiled_step.EncoderProgram)."""

    def __init__(self, layer: EncoderLayer):
        super().__init__(layer.pre_norm)
        self.layer_norm, self.self_attn = layer.layer_norm, layer.self_attn
        self.feed_forward = layer.feed_forward
        self.qkv = _fused_qkv(layer.self_attn)

    def forward(self, x: torch.Tensor, bias: torch.Tensor, bf16: bool = False) -> torch.Tensor:
        """x (B, S, H), ``bias`` (B, 1, 1, S): MASKED_LOGIT at padding -> (B, S, H)."""
        rows, length, _ = x.shape
        attn = self.self_attn
        q, keys, values = (attn.split_heads(part) for part in product(
            self.qkv, self.before(self.layer_norm, x), bf16=bf16).chunk(3, dim=-1))
        weights = torch.softmax(torch.matmul(q, keys.transpose(2, 3)) + bias, dim=-1)
        context = attn.merge_heads(torch.matmul(weights, values), rows, length)
        x = self.after(self.layer_norm, product(attn.final_linear, context, bf16=bf16) + x)
        return self.feed_forward_block(x, bf16)


class FastDecoderLayer(FastResidual):
    """A DecoderLayer's step on the fast path, with the layer's own modules (weights shared),
    called without the module machinery and without the no-op dropouts. Its blocks between
    the attentions (``project``, ``between``, ``finish``) are also the parts of the compiled
    step (compiled_step.py)."""

    def __init__(self, layer: DecoderLayer):
        super().__init__(layer.pre_norm)
        self.layer_norm_1, self.layer_norm_2 = layer.layer_norm_1, layer.layer_norm_2
        self.self_attn, self.context_attn = layer.self_attn, layer.context_attn
        self.feed_forward = layer.feed_forward
        self.qkv = _fused_qkv(layer.self_attn)
        scale = 1 / math.sqrt(layer.self_attn.dim_per_head)
        query = layer.context_attn.linear_query
        self.context_query = _linear(query.weight * scale,
                                     None if query.bias is None else query.bias * scale)

    def project(self, x: torch.Tensor, bf16: bool = False):
        """x (B, T, H) -> scaled queries, keys, values (B, h, T, d) each (``bf16``: see
        product, as in ``between`` and ``finish``)."""
        qkv = product(self.qkv, self.before(self.layer_norm_1, x), bf16=bf16)
        return tuple(self.self_attn.split_heads(part) for part in qkv.chunk(3, dim=-1))

    def between(self, context: torch.Tensor, x: torch.Tensor, bf16: bool = False):
        """The self-attention's contexts (B, T, H) -> the layer's state after it and the
        context attention's scaled queries (B, T, H)."""
        query = self.after(self.layer_norm_1,
                           product(self.self_attn.final_linear, context, bf16=bf16) + x)
        return query, product(self.context_query, self.before(self.layer_norm_2, query),
                              bf16=bf16)

    def finish(self, context: torch.Tensor, query: torch.Tensor,
               bf16: bool = False) -> torch.Tensor:
        out = self.after(self.layer_norm_2,
                         product(self.context_attn.final_linear, context, bf16=bf16) + query)
        return self.feed_forward_block(out, bf16)

    def memory_kv(self, memory: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The context attention's keys, transposed (B, h, d, S), and values (B, h, S, d), each
        contiguous: batched products read them as they lie, with no copy a step."""
        keys, values = self.context_attn.project_kv(memory)
        return keys.transpose(2, 3).contiguous(), values.contiguous()

    def source_mask(self, mask: torch.Tensor) -> torch.Tensor:
        """The source mask (B, 1, 1, S), True at padding, as a bias (B, h, 1, S) to add to the
        scores inside their product: -1e18 + a score is -1e18, as masked_fill makes it."""
        return masked_bias(mask).expand(-1, self.context_attn.heads, -1, -1).contiguous()

    def pad_source(self, entry: torch.Tensor, width: int, kind: str) -> torch.Tensor:
        """As DecoderLayer.pad_source for this layer's entries: the mask, a bias, with
        MASKED_LOGIT; the keys, transposed (B, h, d, S), on their last dimension."""
        if entry.size(2 if kind == "values" else -1) == width:
            return entry  # F.pad would copy it
        if kind == "values":
            return nn.functional.pad(entry, (0, 0, 0, width - entry.size(2)))
        return nn.functional.pad(entry, (0, width - entry.size(-1)),
                                 value=MASKED_LOGIT if kind == "mask" else 0.0)

    def context_attention(self, q, keys, values, bias, group: int):
        """Scaled queries q (B, T, H) over transposed keys (B / group, h, d, S) and values,
        ``bias`` from source_mask: the contexts (B, T, H) and the weights (B / group, h,
        group * T, S)."""
        rows, length, _ = q.shape
        sources, heads, dim, width = keys.shape
        q = q.view(sources, group * length, heads, dim).transpose(1, 2).reshape(
            sources * heads, group * length, dim)
        keys, bias = keys.view(sources * heads, dim, width), bias.view(sources * heads, 1, width)
        if q.dtype == torch.float32:
            scores = torch.baddbmm(bias, q, keys)
        else:  # softmax in fp32, as MultiHeadedAttention
            scores = torch.bmm(q, keys).float() + bias
        weights = torch.softmax(scores, dim=-1).to(q.dtype)
        context = torch.bmm(weights, values.view(sources * heads, width, dim))
        return (self.context_attn.merge_heads(context.view(sources, heads, -1, dim), rows, length),
                weights.view(sources, heads, -1, width))

    def self_attention(self, q, keys, values, mask) -> torch.Tensor:
        """Contexts (B, h, T, d) of scaled queries q over keys/values (B, h, S, d)."""
        if mask is None and q.size(2) == 1:  # one step, unmasked
            if keys.size(2) < FEW_KEYS:
                weights = torch.softmax((q * keys).sum(-1, keepdim=True), dim=2)  # (B, h, S, 1)
                return (weights * values).sum(2, keepdim=True)
            if q.size(0) <= FEW_ROWS:
                return nn.functional.scaled_dot_product_attention(q, keys, values, scale=1.0)
        return self.self_attn.attention(q, keys, values, mask)[0]

    def forward(self, x, cache, index: int, self_mask, mem_kv, src_mask, group: int):
        """As DecoderLayer.forward."""
        rows, length = x.size(0), x.size(1)  # the compiled blocks see contiguous (B, T, H)
        q, keys, values = self.project(x)
        if cache is not None:
            keys, values = cache.append(index, keys, values)
        context = self.self_attention(q, keys, values, self_mask)
        query, q = self.between(self.self_attn.merge_heads(context, rows, length), x)
        context, attn = self.context_attention(q, *mem_kv, src_mask, group)
        return self.finish(context, query), attn


class FoldedLSTMCell(nn.Module):
    """The first LSTM cell of an input-feeding decoder, its input x = [the table row of the
    word (4H: embedding product and biases); the input feed (H)]: one product for the input
    feed and the hidden state together."""

    def __init__(self, cell: nn.LSTMCell, feed_size: int):
        super().__init__()
        self.gates = cell.weight_ih.size(0)
        self.product = _linear(torch.cat([cell.weight_ih[:, -feed_size:], cell.weight_hh], 1))

    def forward(self, x: torch.Tensor, state):
        hidden, cell = state
        rest = product(self.product, torch.cat([x[:, self.gates:], hidden], dim=1))
        return lstm_update(x[:, :self.gates] + rest, cell, sigmoid_tanh)


class JoinedLSTMCell(nn.Module):
    """An LSTM cell above the first: its two products made as one, over its input and its
    hidden state side by side (the two biases summed)."""

    def __init__(self, cell: nn.LSTMCell):
        super().__init__()
        self.product = _linear(torch.cat([cell.weight_ih, cell.weight_hh], 1),
                               None if cell.bias_ih is None else cell.bias_ih + cell.bias_hh)

    def forward(self, x: torch.Tensor, state):
        hidden, cell = state
        return lstm_update(product(self.product, torch.cat([x, hidden], dim=1)), cell,
                           sigmoid_tanh)


class FoldedGRUCell(nn.Module):
    """FoldedLSTMCell's GRU twin: x = [the word's table row (3H); the input feed (H)]."""

    def __init__(self, cell: nn.GRUCell, feed_size: int):
        super().__init__()
        self.gates = cell.weight_ih.size(0)
        self.feed = _linear(cell.weight_ih[:, -feed_size:])
        self.hidden = _linear(cell.weight_hh, cell.bias_hh)

    def forward(self, x: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        from_input = x[:, :self.gates] + product(self.feed, x[:, self.gates:])
        return gru_update(from_input, product(self.hidden, hidden), hidden, sigmoid_tanh)


class FoldedGlobalAttention(nn.Module):
    """GlobalAttention with its products with the memory made by ``project_memory``, once per
    batch: the score's keys (the memory, its ``general`` projection or its ``mlp`` share) and the
    memory's output projection, side by side (B, S, 2H)."""

    def __init__(self, attn: GlobalAttention):
        super().__init__()
        self.attn = attn  # its mlp layers score
        dim, weight = attn.linear_out.out_features, attn.linear_out.weight.detach()
        self.register_buffer("context_out", weight[:, :dim].contiguous(), persistent=False)
        self.register_buffer("query_in", attn.linear_in.weight.detach().t().contiguous()
                             if attn.attn_type == "general" else None, persistent=False)
        self.query_out = _linear(weight[:, dim:], attn.linear_out.bias)

    def project_memory(self, memory: torch.Tensor) -> torch.Tensor:
        if self.attn.attn_type == "mlp":
            keys = self.attn.linear_context(memory)
        else:
            keys = memory if self.query_in is None else nn.functional.linear(memory,
                                                                             self.query_in)
        return torch.cat([keys, nn.functional.linear(memory, self.context_out)], dim=-1)

    def forward(self, query: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor,
                memory_proj: torch.Tensor, group: int = 1):
        """As GlobalAttention.forward, ``memory_proj`` from project_memory."""
        batch, length, dim = query.shape
        keys, values = memory_proj.split(dim, dim=-1)
        grouped = query.reshape(-1, group * length, dim)
        if self.attn.attn_type == "mlp":
            align = self.attn.score(grouped, memory, keys)
        else:
            align = torch.bmm(grouped, keys.transpose(1, 2))
        weights = torch.softmax(align.masked_fill(src_mask, float("-inf")), dim=-1)
        output = torch.bmm(weights, values).view(batch, length, dim) + product(self.query_out, query)
        if self.attn.attn_type != "mlp":
            output = sigmoid_tanh(output)
        return output, weights.view(batch, length, -1)


def fold_rnn(decoder: InputFeedRNNDecoder) -> None:
    """Puts an input-feeding RNN decoder on the fast path, in place (see the module's text)."""
    cells, feed = decoder.rnn, decoder.hidden_size
    first = cells.layers[0]
    embedding = decoder.embeddings.weight.detach()
    table_bytes = embedding.size(0) * first.weight_ih.size(0) * embedding.element_size()
    if table_bytes <= MAX_TABLE_BYTES:
        with torch.no_grad():
            bias = first.bias_ih + first.bias_hh if cells.is_lstm else first.bias_ih
            table = nn.functional.linear(embedding, first.weight_ih[:, :-feed], bias)
        decoder.embeddings = nn.Embedding.from_pretrained(table, freeze=True)
        cells.layers[0] = (FoldedLSTMCell if cells.is_lstm else FoldedGRUCell)(first, feed)
    if cells.is_lstm:
        for i in range(1, len(cells.layers)):
            cells.layers[i] = JoinedLSTMCell(cells.layers[i])
    decoder.attn = FoldedGlobalAttention(decoder.attn)


def to_fast(decoder: nn.Module) -> nn.Module:
    """Puts a decoder on the fast path, in place: a TransformerDecoder's layers as
    FastDecoderLayers, an input-feeding RNN decoder's folds. Returns the decoder."""
    if isinstance(decoder, InputFeedRNNDecoder):
        fold_rnn(decoder)
    elif isinstance(decoder, TransformerDecoder):
        decoder.layers = nn.ModuleList(FastDecoderLayer(layer) for layer in decoder.layers)
    return decoder
