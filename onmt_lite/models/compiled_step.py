"""The Transformer decoder's step compiled whole (``-compile``): the embedding, every layer and
the final norm as one graph, so a step is one call into compiled code instead of some two
hundred operations each dispatched on its own.

What makes one graph serve every step of every batch:
- The position is a tensor, not a number, and the self-attention reads the cache's whole
  capacity (KVCache grows it geometrically: 16, 32, 64... positions), later positions masked:
  a step's shapes change only when the capacity grows.
- The graph writes nothing into the cache: it attends to the cached prefix and to its own new
  keys and values, and returns those, which one copy then writes into the cache at the
  position. An in-place write inside the graph would make Inductor copy the whole cache back
  at every step.
- Dynamic shapes without "duck sizing" (equal sizes are not assumed equal for ever), so rows,
  source length, capacity and the rows per source row are free: the fixture compiles five
  graphs (the first step, where the hypotheses share one row each, the steps after it, and
  their cases of one row or one sentence).

With ``-precision bf16`` the products run in bf16 under autocast inside the graph (oneDNN's
kernels for the CPU's AMX or AVX-512 BF16 units); norms, softmaxes and the cache stay fp32.

Cache positions past the prefix are masked, and their values weighted by an exact zero; a zero
times a NaN would still be NaN, so the decoder's cache is made with zeroed memory (KVCache's
``zeroed``).

Nothing here is CPU-only, but on CUDA (an H100, torch 2.11.0+cu130) torch fails to trace the
dynamic-shape graph (BackendCompilerFailed, ``prims::convert_element_type`` given a MetaProxy,
with the aot_eager backend too), and the step then runs uncompiled after one line
(build_translator); compiled with static shapes it gives the uncompiled step's translations.
What a GPU would add is CUDA graphs (``mode="reduce-overhead"``), which need shapes that never
change: finished rows kept and masked instead of dropped, and one capacity for the whole batch.
"""
from typing import Callable, Tuple

import torch

from onmt_lite.constants import MASKED_LOGIT


class CompiledStep:
    """``decoder.step`` for a TransformerDecoder whose layers are FastDecoderLayers, with its
    work compiled by ``compile`` (see fast.compiler). Holds no decoder state: replicas of the
    decoder (other threads) share one CompiledStep and its compiled code.

    Args:
        decoder: the TransformerDecoder (its modules are shared, not copied).
        compile: turns the step function into its compiled version.
        bf16: run the products in bf16 (autocast) inside the graph.
    """

    def __init__(self, decoder, compile: Callable, bf16: bool = False):
        self.embeddings, self.layers, self.norm = (decoder.embeddings, decoder.layers,
                                                   decoder.layer_norm)
        self.bf16 = bf16
        self.graph = compile(self._step)

    def __call__(self, decoder, tokens: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """One step of ``decoder`` (its state and cache): tokens (B,) -> out (B, H), attn (B, S)."""
        cache, position = decoder.cache, decoder.position
        if position + 1 > self.embeddings.max_len:
            raise ValueError(f"sequence longer than {self.embeddings.max_len} positions")
        cache.reserve(1)
        state = decoder.state
        memory = [state[key] for key in decoder.source_keys[1:]]  # keys, values of each layer
        out, attn, new = self.graph(cache.to_buffer(tokens).contiguous(),
                                    torch.tensor(position, device=tokens.device),
                                    cache.buffer, memory, state["src_mask"], decoder.group)
        cache.buffer[:, :, :new.size(2), :, position:position + 1] = new
        cache.advance(1)
        decoder.position = position + 1
        return cache.from_buffer(out), cache.from_buffer(attn)

    def _step(self, tokens, position, buffer, memory, src_bias, group: int):
        """The compiled function: tokens (R,) in cache order at ``position`` (a 0-d tensor);
        the cache ``buffer`` (layers, 2, rows, heads, capacity, dim) holds the prefix. Returns the output
        (R, H), head 0 of the last context attention (R, S) and the step's keys and values
        (layers, 2, R, heads, 1, dim)."""
        if self.bf16:
            with torch.autocast(tokens.device.type, dtype=torch.bfloat16):
                out, attn, new = self._layers(tokens, position, buffer, memory, src_bias, group)
            return out.float(), attn.float(), new.float()
        return self._layers(tokens, position, buffer, memory, src_bias, group)

    def _layers(self, tokens, position, buffer, memory, src_bias, group: int):
        emb, rows = self.embeddings, tokens.size(0)
        x = emb.embeddings(tokens) * emb.scale + emb.pe.index_select(0, position.view(1))
        x = x.unsqueeze(1)
        later = torch.arange(buffer.size(4), device=tokens.device) >= position  # not yet written
        new, attn = [], None
        for i, layer in enumerate(self.layers):
            q, keys, values = layer.project(x)  # (R, h, 1, d) each
            new += [keys, values]
            past_keys, past_values = buffer[i, 0, :rows], buffer[i, 1, :rows]  # (R, h, C, d)
            scores = torch.cat([torch.matmul(q, past_keys.transpose(2, 3)).masked_fill(
                later, MASKED_LOGIT), (q * keys).sum(-1, keepdim=True)], dim=-1)
            weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)
            context = torch.matmul(weights[..., :-1], past_values) + weights[..., -1:] * values
            query, q = layer.between(layer.self_attn.merge_heads(context, rows, 1), x)
            context, attn = layer.context_attention(q, memory[2 * i], memory[2 * i + 1],
                                                    src_bias, group)
            x = layer.finish(context, query)
        out = self.norm(x).squeeze(1)
        new = torch.stack(new).view(len(self.layers), 2, rows, *keys.shape[1:])
        return out, attn[:, 0].reshape(rows, -1), new
