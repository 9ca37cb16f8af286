"""Matrix products through oneDNN: the weight packed once in its blocked layout, the rows padded
to a few shapes. bf16 products (bfloat16.py) run here, and so do the fast path's fp32 products on
a CPU where MKL's are slow.

MKL takes a slow path on CPUs not made by Intel: it leaves their AVX-512 unused. On an AMD EPYC
with AVX-512 (Zen 4), one thread, oneDNN's fp32 products take 0.36-0.45x MKL's time at a step's
rows (4, 20 or 160 rows of 192 x 8,000, 256 x 3,560, 512 x 2,048). On one with AVX2 only (Zen 3)
they take 1.2-10x MKL's time at 1-16 rows of the Argos package's 192 x 192 to 768 x 192, 1.1-2.3x
at 64-160 rows, 0.9-1.4x on its 192 x 8,000 output layer, and the fast path's batches and lone
sentences take 1.07-1.08x its time with them (Transformer fixture): there MKL keeps its products.
Their sums are ordered differently, so their results differ in the last bits: exact decoding
keeps torch's own products (OpenNMT-py's, to the bit); the fast path, judged by BLEU, takes
oneDNN's where MKL's are slow (``mkl_is_slow``).

oneDNN compiles and keeps a kernel for every shape it meets (~0.5 MiB and 0.5-4 ms each): a
product's rows are padded to the next power of two up to ROW_MULTIPLE, then to a multiple of it,
in blocks of at most MAX_ROWS, so that a whole input meets only a few shapes a weight (160 shapes
of each of five weights unpadded: 433 MiB).
"""
import functools
from typing import Optional

import torch
from torch import nn

from onmt_lite.models.swap import swap_layers

ROW_MULTIPLE = 32
MAX_ROWS = 256


@functools.lru_cache(maxsize=None)
def mkl_is_slow() -> bool:
    """Whether fp32 products run faster through oneDNN than through torch's MKL here: on an
    x86 CPU with AVX-512 not made by Intel, with a torch build that has oneDNN."""
    return torch.backends.mkldnn.is_available() and cpu_vendor() not in ("", "GenuineIntel") \
        and torch.backends.cpu.get_cpu_capability().startswith("AVX512")


def cpu_vendor() -> str:
    """/proc/cpuinfo's vendor_id ("GenuineIntel", "AuthenticAMD"); "" where it cannot say."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f
                         if line.startswith("vendor_id")), "")
    except OSError:
        return ""


def pack(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The weight (out, in) in ``dtype``, in oneDNN's blocked layout where this torch build offers
    it: made once instead of at every product (1.1-1.9x faster products, the same results)."""
    weight = weight.detach().to(dtype).contiguous()
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight, ROW_MULTIPLE)
    except (AttributeError, RuntimeError):
        return weight


def padded_rows(rows: int) -> int:
    """The rows a product of ``rows`` (<= MAX_ROWS) runs on: 1, 2, 4 ... ROW_MULTIPLE, then
    multiples of ROW_MULTIPLE."""
    if rows >= ROW_MULTIPLE:
        return -(-rows // ROW_MULTIPLE) * ROW_MULTIPLE
    return 1 << (rows - 1).bit_length()


def product(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
            relu: bool = False) -> torch.Tensor:
    """x (..., in) fp32 times a packed weight (out, in) in the weight's type (``bias`` fp32, added
    after, and relu); returns fp32 (..., out)."""
    flat = x.reshape(-1, x.size(-1))
    blocks = [_block(b, weight, bias, relu) for b in flat.split(MAX_ROWS)]
    out = blocks[0] if len(blocks) == 1 else torch.cat(blocks)
    return out.view(*x.shape[:-1], out.size(-1))


def _block(flat: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
           relu: bool) -> torch.Tensor:
    rows, fp32 = flat.size(0), weight.dtype == torch.float32
    size = padded_rows(rows)
    if size != rows:
        padded = flat.new_zeros((size, flat.size(1)), dtype=weight.dtype)
        padded[:rows] = flat
    else:
        padded = flat.to(weight.dtype).contiguous()
    if fp32:  # oneDNN adds the bias and applies the relu inside the product
        return _linear(padded, weight, bias, "relu" if relu else "none")[:rows]
    out = _linear(padded, weight, None, "none")[:rows].float()
    out = out if bias is None else out + bias
    return torch.relu_(out) if relu else out


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], post: str):
    if weight.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, post, [], "")
    out = nn.functional.linear(x, weight, bias)
    return torch.relu_(out) if post == "relu" else out


def fp32_bias(bias: Optional[torch.Tensor]) -> Optional[nn.Parameter]:
    return None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)


class OneDNNLinear(nn.Module):
    """An nn.Linear whose product runs through oneDNN, its weight in ``dtype`` (fp32 here, bf16
    in bfloat16.Bfloat16Linear), its bias and result in fp32."""
    dtype = torch.float32

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = pack(linear.weight, self.dtype), fp32_bias(linear.bias)

    def forward(self, x: torch.Tensor, relu: bool = False) -> torch.Tensor:
        return product(x, self.weight, self.bias, relu)


def to_onednn(modules, skip=()) -> None:
    """Replaces, in place, every fp32 nn.Linear on the CPU below ``modules`` (a module or a list;
    except those below a module of ``skip``) by a OneDNNLinear. Shared layers stay shared."""
    def onednn(layer: nn.Module) -> Optional[nn.Module]:
        fp32_on_cpu = type(layer) is nn.Linear and layer.weight.dtype == torch.float32 \
            and layer.weight.device.type == "cpu"
        return OneDNNLinear(layer) if fp32_on_cpu else None
    swap_layers(modules, onednn, skip)
