"""bf16 matrix products for CPU decoding (``-precision bf16`` without a GPU).

Only the weight matrices are stored in bf16: products then run on the CPU's bf16 units (AMX,
AVX-512 BF16), several times faster than fp32 ones. Everything else (activations between
layers, biases, softmax, layer norm, the LSTM cell state, the search's scores) stays fp32, so the
only loss is the rounding of each product's inputs and output to bf16. The products run through
oneDNN (onednn.py).
"""
import logging
from typing import Iterable, List, Optional, Tuple, Union

import torch
from torch import nn

from onmt_lite.models.onednn import OneDNNLinear, fp32_bias, pack, product
from onmt_lite.models.rnn import gru_update, lstm_update
from onmt_lite.models.swap import swap_layers

logger = logging.getLogger("onmt_lite")


def _bf16(weight: torch.Tensor) -> torch.Tensor:
    return pack(weight, torch.bfloat16)


class Bfloat16Linear(OneDNNLinear):
    dtype = torch.bfloat16


class Bfloat16LSTMCell(nn.Module):
    """nn.LSTMCell's step with one bf16 product for input and hidden state together."""

    def __init__(self, cell: nn.LSTMCell):
        super().__init__()
        self.weight = _bf16(torch.cat([cell.weight_ih, cell.weight_hh], dim=1))
        self.bias = fp32_bias(None if cell.bias_ih is None else cell.bias_ih + cell.bias_hh)

    def forward(self, x: torch.Tensor, state: Tuple[torch.Tensor, torch.Tensor]):
        hidden, cell = state
        return lstm_update(product(torch.cat([x, hidden], dim=1), self.weight, self.bias), cell)


class Bfloat16GRUCell(nn.Module):
    """nn.GRUCell's step; the reset gate scales the hidden state's product, so two products."""

    def __init__(self, cell: nn.GRUCell):
        super().__init__()
        self.weight_ih, self.weight_hh = _bf16(cell.weight_ih), _bf16(cell.weight_hh)
        self.bias_ih, self.bias_hh = fp32_bias(cell.bias_ih), fp32_bias(cell.bias_hh)

    def forward(self, x: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return gru_update(product(x, self.weight_ih, self.bias_ih),
                          product(hidden, self.weight_hh, self.bias_hh), hidden)


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
    def bf16(layer: nn.Module) -> Optional[nn.Module]:
        version = BFLOAT16_VERSIONS.get(type(layer))
        return None if version is None else version(layer)
    swap_layers(modules, bf16, skip)
