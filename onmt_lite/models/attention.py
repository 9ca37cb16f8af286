"""Attention layers. Each returns (context, weights); none stores weights on itself."""
import math
from typing import Optional, Tuple

import torch
from torch import nn

from onmt_lite.constants import MASKED_LOGIT


def masked_bias(mask: torch.Tensor) -> torch.Tensor:
    """A mask (True = masked) as a bias to add to scores: MASKED_LOGIT where masked, else 0
    (-1e18 + a score is -1e18, as masked_fill makes it)."""
    return torch.zeros(mask.shape, device=mask.device).masked_fill_(mask, MASKED_LOGIT)


class GlobalAttention(nn.Module):
    """Luong attention of the RNN decoder: ``dot``, ``general`` or ``mlp`` (Bahdanau) scores."""

    def __init__(self, dim: int, attn_type: str = "general"):
        super().__init__()
        if attn_type not in ("dot", "general", "mlp"):
            raise ValueError(f"unsupported global_attention {attn_type!r}")
        self.attn_type = attn_type
        if attn_type == "general":
            self.linear_in = nn.Linear(dim, dim, bias=False)
        elif attn_type == "mlp":
            self.linear_context = nn.Linear(dim, dim, bias=False)
            self.linear_query = nn.Linear(dim, dim, bias=True)
            self.v = nn.Linear(dim, 1, bias=False)
        self.linear_out = nn.Linear(dim * 2, dim, bias=attn_type == "mlp")

    def project_memory(self, memory: torch.Tensor) -> Optional[torch.Tensor]:
        """The memory's share of ``mlp`` scores, computed once per sentence (None otherwise)."""
        return self.linear_context(memory) if self.attn_type == "mlp" else None

    def score(self, query: torch.Tensor, memory: torch.Tensor,
              memory_proj: Optional[torch.Tensor] = None) -> torch.Tensor:
        """(B, T, H) x (B, S, H) -> (B, T, S)."""
        if self.attn_type == "mlp":
            wq = self.linear_query(query).unsqueeze(2)  # (B, T, 1, H)
            if memory_proj is None:
                memory_proj = self.linear_context(memory)
            return self.v(torch.tanh(wq + memory_proj.unsqueeze(1))).squeeze(-1)
        if self.attn_type == "general":
            query = self.linear_in(query)
        return torch.bmm(query, memory.transpose(1, 2))

    def forward(self, query: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor,
                memory_proj: Optional[torch.Tensor] = None,
                group: int = 1) -> Tuple[torch.Tensor, torch.Tensor]:
        """Attends ``query`` (B, T, H) over ``memory`` (B / group, S, H).

        Each run of ``group`` consecutive query rows shares one memory row (a sentence's beam
        hypotheses): one matrix product per sentence instead of one per hypothesis.

        Args:
            src_mask: (B / group, 1, S), True at padded positions.
            memory_proj: project_memory(memory), if already computed.
        Returns:
            output (B, T, H) and attention weights (B, T, S).
        """
        batch, length, dim = query.shape
        grouped = query.reshape(-1, group * length, dim)
        align = self.score(grouped, memory, memory_proj).masked_fill(src_mask, float("-inf"))
        weights = torch.softmax(align, dim=-1)
        context = torch.bmm(weights, memory).view(batch, length, dim)
        output = self.linear_out(torch.cat([context, query], dim=-1))
        if self.attn_type != "mlp":
            output = torch.tanh(output)
        return output, weights.view(batch, length, -1)


class MultiHeadedAttention(nn.Module):
    """Multi-head scaled dot-product attention (OpenNMT-py layout: no bias by default)."""

    def __init__(self, heads: int, dim: int, dropout: float = 0.0, bias: bool = False):
        super().__init__()
        if dim % heads:
            raise ValueError(f"hidden size {dim} is not a multiple of heads {heads}")
        self.heads, self.dim_per_head = heads, dim // heads
        self.linear_keys = nn.Linear(dim, dim, bias=bias)
        self.linear_values = nn.Linear(dim, dim, bias=bias)
        self.linear_query = nn.Linear(dim, dim, bias=bias)
        self.final_linear = nn.Linear(dim, dim, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.heads, self.dim_per_head).transpose(1, 2)  # (B, h, L, d)

    def project_kv(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of ``x`` (B, L, H), each (B, h, L, d)."""
        return self.split_heads(self.linear_keys(x)), self.split_heads(self.linear_values(x))

    def project_query(self, x: torch.Tensor) -> torch.Tensor:
        """Queries of ``x`` (B, T, H), scaled: (B, h, T, d)."""
        return self.split_heads(self.linear_query(x)) / math.sqrt(self.dim_per_head)

    def attend(self, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
               mask: Optional[torch.Tensor],
               group: int = 1) -> Tuple[torch.Tensor, torch.Tensor]:
        """``query`` (B, T, H) over projected ``keys``/``values`` (B / group, h, S, d).

        Each run of ``group`` consecutive query rows shares one row of keys and values (a
        sentence's beam hypotheses and its memory): their scores come from one matrix product
        instead of ``group`` vector products over copies of the memory.

        Args:
            mask: broadcastable to (B / group, 1, group * T, S), True where attention is forbidden.
        Returns:
            output (B, T, H) and weights (B / group, h, group * T, S).
        """
        q = self.project_query(query)
        context, weights = self.attention(q, keys, values, mask, group)
        return self.output(context, q.size(0), q.size(2)), weights

    def attention(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                  mask: Optional[torch.Tensor], group: int = 1):
        """Projected queries (B, h, T, d) over keys/values: the contexts (B / group, h,
        group * T, d) before the output projection, and the weights."""
        q = self._grouped(q, group)
        scores = torch.matmul(q, keys.transpose(2, 3)).float()
        if mask is not None:
            scores = scores.masked_fill(mask, MASKED_LOGIT)
        weights = torch.softmax(scores, dim=-1).to(q.dtype)
        return torch.matmul(self.dropout(weights), values), weights

    @staticmethod
    def _grouped(q: torch.Tensor, group: int) -> torch.Tensor:
        """(B, h, T, d) -> (B / group, h, group * T, d): a group's queries side by side."""
        if group == 1:
            return q
        batch, heads, length, dim = q.shape
        return q.view(-1, group, heads, length, dim).transpose(1, 2).reshape(
            -1, heads, group * length, dim)

    def output(self, context: torch.Tensor, batch: int, length: int) -> torch.Tensor:
        """(B / group, h, group * T, d) contexts of ``batch`` query rows of ``length`` -> the
        final projection (B, T, H)."""
        return self.final_linear(self.merge_heads(context, batch, length))

    def merge_heads(self, context: torch.Tensor, batch: int, length: int) -> torch.Tensor:
        """(B / group, h, group * T, d) -> (B, T, h * d), contiguous."""
        heads, dim = self.heads, self.dim_per_head
        return context.view(-1, heads, batch // context.size(0), length, dim).permute(
            0, 2, 3, 1, 4).reshape(batch, length, heads * dim)
