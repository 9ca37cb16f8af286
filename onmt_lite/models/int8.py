"""``-int8``: dynamic int8 quantisation (weights int8 per tensor, made once; each product's input
quantised as it comes), and which of torch's CPU kernels run it (``-int8_engine``).

A model stored in int8 (a CTranslate2 model or Argos package quantised to int8) has one scale per
output row, each row's largest weight at 127: ``quantize_rows`` quantises its linear layers that
way, which gives back exactly the int8 values it was stored with (the weights are read as their
dequantised rows, int8 / scale, and a row's int8 values are its weights over its largest times
127, which the fast path's fusions keep: they put rows side by side, or scale a whole row).

torch packs a layer's int8 weights for one engine, chosen by ``torch.backends.quantized.engine``
when they are packed; the product then runs that engine's kernel. Both engines quantise the same
way (inputs to 7 bits, ``reduce_range``, as the layers' own calls do), so they round
differently, nothing more. ``auto`` keeps torch's default (fbgemm on x86). On an Intel Xeon
with AMX, oneDNN's products alone are 1.4-2.3x fbgemm's speed over 60 rows or more (one thread;
slower below 8 rows), but a decoding of the Transformer fixture is no faster (1,000 lines, one
thread: level; two workers: 0.95x, each process 35% larger): its products are a step's larger
share only for larger models or batches (docs/speed.md).
"""
import contextlib
import warnings

import torch
from torch import nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear
from torch.ao.quantization.quantization_mappings import get_default_dynamic_quant_module_mappings

from onmt_lite.constants import INT8_ENGINES as ENGINES
from onmt_lite.errors import OptionError
from onmt_lite.models.swap import swap_layers


def supported_engines() -> list:
    return torch.backends.quantized.supported_engines


def pick_engine(choice: str = "auto") -> str:
    """The quantised engine ``-int8_engine choice`` names on this CPU and torch build."""
    supported = supported_engines()
    if choice == "auto":
        return torch.backends.quantized.engine
    if choice not in ENGINES:
        raise OptionError(f"-int8_engine must be one of {', '.join(ENGINES)}")
    if choice not in supported:
        raise OptionError(f"-int8_engine {choice}: this torch build has no such engine "
                          f"(it has {', '.join(e for e in supported if e != 'none')})")
    return choice


@contextlib.contextmanager
def packing_for(engine: str):
    """Weights quantised inside pack for ``engine``; torch's global setting is put back."""
    before = torch.backends.quantized.engine
    torch.backends.quantized.engine = engine
    try:
        yield
    finally:
        torch.backends.quantized.engine = before


# torch's int8 products as their C++ functions: the torch.ops entry point spends ~12 us a call
# looking for the stand-in arguments that only torch.compile's tracing passes
INT8_LINEAR, INT8_LINEAR_RELU = (getattr(op, "_op", op) for op in (
    torch.ops.quantized.linear_dynamic, torch.ops.quantized.linear_relu_dynamic))


class Int8Linear(DynamicQuantizedLinear):
    """torch's dynamic int8 Linear with its product called as its C++ function (see INT8_LINEAR),
    as a module too: the encoder's layers and the memory's projections call their products as
    modules."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._packed_params.dtype != torch.qint8:
            return super().forward(x)
        return INT8_LINEAR(x, self._packed_params._packed_params, True)  # reduce_range, as torch


def quantize(model: nn.Module, layers: set, engine: str = "auto") -> nn.Module:
    """``model`` with its ``layers`` (module types) replaced in place by dynamic int8 ones
    (nn.Linear by Int8Linear), packed for ``pick_engine(engine)``."""
    mapping = {**get_default_dynamic_quant_module_mappings(), nn.Linear: Int8Linear}
    with warnings.catch_warnings(), packing_for(pick_engine(engine)):
        warnings.simplefilter("ignore")  # torch flags its quantised tensor types as legacy
        return torch.ao.quantization.quantize_dynamic(model, layers, dtype=torch.qint8,
                                                      mapping=mapping, inplace=True)


def quantize_rows(model: nn.Module, engine: str = "auto") -> nn.Module:
    """``model`` with every nn.Linear replaced in place by a dynamic int8 one whose weight has one
    scale per output row (largest magnitude to 127), packed for ``pick_engine(engine)``."""
    with warnings.catch_warnings(), packing_for(pick_engine(engine)):
        warnings.simplefilter("ignore")  # torch flags its quantised tensor types as legacy
        swap_layers(model, lambda layer: _row_quantized(layer) if type(layer) is nn.Linear
                    else None)
    return model


def _row_quantized(linear: nn.Linear) -> Int8Linear:
    weight = linear.weight.detach().float()
    largest = weight.abs().amax(dim=1)
    scales = torch.where(largest > 0, largest / 127, torch.ones_like(largest)).double()
    rows = torch.quantize_per_channel(weight, scales, torch.zeros_like(scales, dtype=torch.long),
                                      0, torch.qint8)
    quantized = Int8Linear(linear.in_features, linear.out_features,
                           bias_=linear.bias is not None, dtype=torch.qint8)
    quantized.set_weight_bias(rows, None if linear.bias is None else linear.bias.detach().float())
    return quantized
