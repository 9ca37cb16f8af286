"""Which decoder step runs: the one place that reads the decoding options and the CPU and
prepares a model for inference.

The search loop (search/loop.py) sees every model through one small interface, the three calls
of NMTModel and the decoder's ``DecoderStep`` (below); each variant of the step implements it in
a module of its own:

- exact (transformer.py, rnn.py): the layers as trained, OpenNMT-py's output word for word;
  the default for fp32 models.
- fast (fast.py, ``-fast``): the step rebuilt (fused products, folds), judged by BLEU.
- compiled (compiled_step.py, aot.py, ``-compile`` where a C++ compiler is found): the fast
  step, the encoder and the output layer as AOTInductor programs; with ``-int8``, the steps
  of a few rows only, from fp32 copies of the layers.
- bf16 (bfloat16.py, ``-precision``; ``auto`` picks it for the fast path on a CPU with bf16
  units, AMX or AVX-512 BF16):
  products in bf16, results in fp32.
- int8 (int8.py, ``-int8``): dynamic int8 products.
- oneDNN (onednn.py): the fast path's fp32 products, on a CPU where MKL's are slow.
- shared (shared_step.py, the server's lanes): several searches' steps run as one.

``plan_step`` turns the options and the CPU into a ``StepPlan`` (refusing what cannot run
here), ``prepare`` applies it; ``for_inference`` does both.
"""
import logging
from dataclasses import dataclass
from typing import Optional, Protocol, Tuple

import torch
from torch import nn

from onmt_lite.errors import OptionError
from onmt_lite.models import aot
from onmt_lite.models.bfloat16 import has_bf16_units, to_bfloat16
from onmt_lite.models.compiled_step import CompiledOutput, CompiledStep, attach, compile_encoder
from onmt_lite.models.fast import to_fast
from onmt_lite.models.int8 import pick_engine, quantize, quantize_rows
from onmt_lite.models.model import NMTModel, pin_submodules
from onmt_lite.models.onednn import mkl_is_slow, to_onednn
from onmt_lite.models.state import StateFn
from onmt_lite.models.transformer import TransformerDecoder

logger = logging.getLogger("onmt_lite")

PRECISIONS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
              "mixed": None}


class DecoderStep(Protocol):
    """What the search loop asks of a decoder. Its state (RNN hidden state, input feed,
    coverage, Transformer key/value caches) lives in the decoder, set by ``init_state``."""

    def init_state(self, src_len: torch.Tensor, memory: torch.Tensor, final=None) -> None:
        """Starts a batch: one state row per source."""

    def map_state(self, fn: StateFn) -> None:
        """Applies ``fn(tensor, dim)`` to every state tensor (repeat for the beam, reorder by
        back-pointers, drop finished sentences)."""

    def step(self, tokens: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """tokens (rows,) -> output (rows, H), attention (rows, S)."""


@dataclass(frozen=True)
class StepPlan:
    """The variant of the step a model runs (see the module's table)."""
    device: str = "cpu"
    precision: str = "fp32"  # fp32, fp16, bf16 or mixed: never auto
    fast: bool = False
    compiled: bool = False  # the step, encoder and output layer as programs
    int8_engine: Optional[str] = None  # -int8_engine (int8.pick_engine), or None: no int8
    int8_rows: bool = False  # int8 weights with one scale per output row (int8.quantize_rows)
    onednn: bool = False  # the fast path's fp32 products through oneDNN (onednn.mkl_is_slow)

    @property
    def bf16(self) -> bool:
        return self.precision in ("bf16", "mixed") and not self.device.startswith("cuda")


def pick_precision(precision: str, device: str, fast: bool, int8: bool, compile: bool) -> str:
    """``-precision auto``: ``mixed`` for the fast path, compiled or not, on a CPU with bf16
    units (AMX, AVX-512 BF16), where it holds -fast's quality bar (BLEU within 0.1 of exact
    decoding, >= 98% of lines identical: on AMX 98.3%, 99.3% and 98.5% on the Transformer and RNN
    fixtures and the shipped model; on AVX-512 BF16, 98.5%, 99.3% and 99.2%), else fp32; any
    other value is kept."""
    if precision != "auto":
        return precision
    if (fast or compile) and not (int8 or device.startswith("cuda")) and has_bf16_units():
        return "mixed"
    return "fp32"


def plan_step(device: str = "cpu", int8: bool = False, precision: str = "fp32",
              fast: bool = False, compile: bool = False, int8_engine: str = "auto",
              int8_rows: bool = False) -> StepPlan:
    """The step these options choose on this machine; combinations that cannot run are refused
    (OptionError). ``-compile -int8`` compiles the steps of a few rows only (CompiledStep's
    ``few_rows_only``). ``int8_rows``: a model stored in int8, whose weights are quantised as
    it stores them."""
    precision = pick_precision(precision, device, fast, int8, compile)
    if precision not in PRECISIONS:
        raise OptionError(f"-precision must be one of auto, {', '.join(PRECISIONS)}")
    on_gpu = device.startswith("cuda")
    if precision == "fp16" and not on_gpu:
        raise OptionError("-precision fp16 needs a GPU (-gpu N); on CPU use bf16")
    if precision == "mixed" and on_gpu:
        raise OptionError("-precision mixed is for CPU decoding; on a GPU use bf16 or fp16")
    if int8 and on_gpu:
        raise OptionError("-int8 is for CPU decoding (drop -gpu)")
    if int8_engine != "auto" and not int8:
        raise OptionError(f"-int8_engine {int8_engine} names the kernels of -int8: add -int8")
    if int8 and precision != "fp32":
        raise OptionError(f"-int8 and -precision {precision} exclude each other")
    if int8:
        pick_engine(int8_engine)  # refused here if this torch has no such kernels
    fast = fast or compile  # the compiled step is the fast step's program
    return StepPlan(device, precision, fast, compile, int8_engine if int8 else None,
                    int8 and int8_rows, onednn=fast and not on_gpu and mkl_is_slow())


def prepare(model: NMTModel, plan: StepPlan, compile_cache: str = "",
            build_programs: bool = True) -> NMTModel:
    """Moves ``model`` to the plan's device in eval mode and puts its step on the plan's variant:
    the fast layers, compiled where a compiler is found (programs built at the first batch, see
    build.warm_up), bf16 products (``bf16`` every product, ``mixed`` those of the encoder and
    decoder layers, the output layer's in fp32), int8 products (the fast layers are quantised
    too), then the fp32 products left through oneDNN where MKL's are slow. Searches keep their
    scores in fp32. Without ``build_programs``, programs the compile cache lacks are not
    built: warm_up raises aot.NotInCache."""
    on_gpu = plan.device.startswith("cuda")
    model = model.to(device=plan.device,
                     dtype=PRECISIONS[plan.precision] if on_gpu else None).eval()
    if plan.fast:
        to_fast(model.decoder)
    if plan.compiled and isinstance(model.decoder, TransformerDecoder):
        build = aot.aot_compiler(compile_cache, build_programs)  # None: no compiler found
        int8 = plan.int8_engine is not None  # int8 products cannot be traced: eager but for
        # the steps of a few rows, programs made from fp32 copies of the layers
        if build is not None:
            model.decoder.compiled_step = CompiledStep(model.decoder, build, plan.bf16,
                                                       few_rows_only=int8)
            if not int8:
                model.compiled_encoder = compile_encoder(model.encoder, build, plan.bf16)
    if plan.bf16:  # compiled programs make their own bf16 products
        to_bfloat16(model if plan.precision == "bf16" else [model.encoder, model.decoder],
                    skip=_compiled_parts(model))
    if plan.int8_engine is not None:
        layers = {nn.Linear, nn.LSTMCell, nn.GRUCell, nn.LSTM, nn.GRU} if plan.fast \
            else {nn.Linear}
        if plan.int8_rows:
            model, layers = quantize_rows(model, plan.int8_engine), layers - {nn.Linear}
        if layers:
            model = quantize(model, layers, plan.int8_engine)
    step = compiled_step(model)
    if step is not None and type(model.generator) is nn.Linear:  # fp32: not -precision bf16
        model.compiled_output = CompiledOutput(model.generator, step.build)
    if plan.onednn:  # what is left in fp32 (all of it, or the output layer of mixed; a
        # compiled output keeps its own, faster than these products and a log-softmax)
        to_onednn(model, skip=_compiled_parts(model))
    pin_submodules(model)
    return model


def _compiled_parts(model: NMTModel) -> list:
    """The encoder and decoder whose programs are made from their fp32 modules."""
    step = compiled_step(model)
    compiled = [model.decoder] if step is not None and not step.few_rows_only else []
    return compiled + ([model.encoder] if model.compiled_encoder is not None else [])


def for_inference(model: NMTModel, device: str, int8: bool = False,
                  precision: str = "fp32", fast: bool = False, compile: bool = False,
                  compile_cache: str = "", int8_engine: str = "auto",
                  int8_rows: bool = False, build_programs: bool = True) -> NMTModel:
    """``model`` prepared for the step the options choose on this machine (plan_step)."""
    return prepare(model, plan_step(device, int8, precision, fast, compile, int8_engine,
                                    int8_rows), compile_cache, build_programs)


def compiled_step(model: NMTModel) -> Optional[CompiledStep]:
    return getattr(model.decoder, "compiled_step", None)


def has_programs(model) -> bool:
    """Whether ``model`` (an NMTModel or ensemble) decodes through compiled programs."""
    return any(compiled_step(part) is not None or part.compiled_encoder is not None
               for part in getattr(model, "models", [model]))


def attach_programs(model, compile_cache: str = "") -> None:
    """The compiled programs of ``model`` (an NMTModel or ensemble read back from a file, as
    the server's lanes map it) loaded from ``compile_cache`` at their first call; without a
    compiler here, the model runs uncompiled."""
    build = aot.aot_compiler(compile_cache)
    for part in getattr(model, "models", [model]):
        if build is None:
            uncompile(part)
        else:
            attach(part, build)


def uncompile(model: NMTModel) -> None:
    """Back to the uncompiled fast path (torch could not build the programs)."""
    if isinstance(model.decoder, TransformerDecoder):
        model.decoder.compiled_step = None
    model.compiled_output = model.compiled_encoder = None

