"""bf16 matrix products for CPU decoding (``-precision bf16`` without a GPU).

Only the weight matrices are stored in bf16: products then run on the CPU's bf16 units (AMX,
AVX-512 BF16), several times faster than fp32 ones. Everything else (activations between
layers, biases, softmax, layer norm, the LSTM cell state, the search's scores) stays fp32, so the
only loss is the rounding of each product's inputs and output to bf16.
"""
import logging
from typing import Iterable, List, Optional, Tuple, Union

import torch
from torch import nn

from onmt_lite.models.rnn import gru_update, lstm_update

logger = logging.getLogger("onmt_lite")

# oneDNN compiles and keeps a kernel for every shape it meets (~0.3 MiB and 1-4 ms each):
# products run on blocks of at most MAX_ROWS rows, padded to a multiple of ROW_MULTIPLE, so
# that a whole input meets only a few shapes.
ROW_MULTIPLE = 32
MAX_ROWS = 256


def _bf16(weight: torch.Tensor) -> torch.Tensor:
    """The weight in bf16, in oneDNN's blocked layout where this torch build offers it: made
    once instead of at every product (1.1-1.9x faster products, the same results)."""
    weight = weight.detach().to(torch.bfloat16)
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight, ROW_MULTIPLE)
    except (AttributeError, RuntimeError):
        return weight


def _linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    if weight.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")
    return nn.functional.linear(x, weight)


def _fp32(bias: Optional[torch.Tensor]) -> Optional[nn.Parameter]:
    return None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)


def _product(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]):
    """x (..., in) fp32 times weight (out, in) bf16, in bf16; returns fp32 (..., out)."""
    blocks = [_block_product(b, weight) for b in x.reshape(-1, x.size(-1)).split(MAX_ROWS)]
    out = blocks[0] if len(blocks) == 1 else torch.cat(blocks)
    out = out.view(*x.shape[:-1], out.size(-1))
    return out if bias is None else out + bias


def _block_product(flat: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """(rows, in) fp32, rows <= MAX_ROWS, padded to a multiple of ROW_MULTIPLE for the product."""
    rows = flat.size(0)
    if rows % ROW_MULTIPLE:
        padded = flat.new_empty((-(-rows // ROW_MULTIPLE) * ROW_MULTIPLE, flat.size(1)),
                                dtype=torch.bfloat16)
        padded[:rows] = flat
        padded[rows:] = 0
    else:
        padded = flat.to(torch.bfloat16)
    return _linear(padded, weight)[:rows].float()


class Bfloat16Linear(nn.Module):
    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight, self.bias = _bf16(linear.weight), _fp32(linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _product(x, self.weight, self.bias)


class Bfloat16LSTMCell(nn.Module):
    """nn.LSTMCell's step with one bf16 product for input and hidden state together."""

    def __init__(self, cell: nn.LSTMCell):
        super().__init__()
        self.weight = _bf16(torch.cat([cell.weight_ih, cell.weight_hh], dim=1))
        self.bias = _fp32(None if cell.bias_ih is None else cell.bias_ih + cell.bias_hh)

    def forward(self, x: torch.Tensor, state: Tuple[torch.Tensor, torch.Tensor]):
        hidden, cell = state
        return lstm_update(_product(torch.cat([x, hidden], dim=1), self.weight, self.bias), cell)


class Bfloat16GRUCell(nn.Module):
    """nn.GRUCell's step; the reset gate scales the hidden state's product, so two products."""

    def __init__(self, cell: nn.GRUCell):
        super().__init__()
        self.weight_ih, self.weight_hh = _bf16(cell.weight_ih), _bf16(cell.weight_hh)
        self.bias_ih, self.bias_hh = _fp32(cell.bias_ih), _fp32(cell.bias_hh)

    def forward(self, x: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return gru_update(_product(x, self.weight_ih, self.bias_ih),
                          _product(hidden, self.weight_hh, self.bias_hh), hidden)


BFLOAT16_VERSIONS = {nn.Linear: Bfloat16Linear, nn.LSTMCell: Bfloat16LSTMCell,
                     nn.GRUCell: Bfloat16GRUCell}


def has_bf16_units() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AMX or AVX-512 BF16)."""
    checks = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def to_bfloat16(modules: Union[nn.Module, List[nn.Module]],
                skip: Iterable[nn.Module] = ()) -> None:
    """Replaces, in place, every Linear, LSTMCell and GRUCell below ``modules`` (except those
    below a module of ``skip``) by its bf16 version. Shared layers (tied weights) stay
    shared."""
    if not has_bf16_units():
        logger.warning("this CPU has no bf16 units (AMX, AVX-512 BF16): -precision bf16 "
                       "will be slower than fp32")
    done = {}
    kept = {id(m) for part in skip for m in part.modules()}
    modules = modules if isinstance(modules, list) else [modules]
    for parent in [m for module in modules for m in module.modules()]:
        if id(parent) in kept:
            continue
        for name, child in parent.named_children():
            version = BFLOAT16_VERSIONS.get(type(child))
            if version is not None:
                if id(child) not in done:
                    done[id(child)] = version(child)
                setattr(parent, name, done[id(child)])
