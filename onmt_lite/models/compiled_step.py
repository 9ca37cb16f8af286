"""The Transformer decoder's step compiled whole (``-compile``): the embedding, every layer and
the final norm as one program, compiled ahead of time by AOTInductor and kept on disk, so a step
is one call into compiled code instead of some two hundred operations each dispatched on its
own.

What makes one program serve every step of every batch:
- Each row's position is an entry of a tensor (rows at different positions share a step, as
  the server's joined searches need), and the self-attention reads the cache's whole capacity
  (KVCache keeps it within 16 columns of the furthest row's position), the columns at and past
  a row's position masked.
- The program writes nothing into the cache: it attends to the cached prefix and to its own new
  keys and values, and returns those, which one copy then writes into the cache at the
  position. An in-place write inside it would copy the whole cache at every step.
- Rows, sources, source length, capacity and the cache's buffer rows are dynamic dimensions of
  one exported program; the rows per source row (``group``: one before the beam is tiled, the
  beam size after it) is fixed in each, so a run builds at most two, and one more for steps
  of a few rows (SMALL_ROWS), the beam's only: the first step of a few sentences has its rows
  tiled before it (tiles_first_step).
- Frozen: the weights are constants of the program, prepacked for the CPU's kernels (oneDNN's
  AMX/AVX-512 bf16 products, MKL's packed fp32 ones). Such weights cannot go through torch's
  compile cache, which is why the program is exported and compiled ahead of time: the package
  (the compiled code and the packed weights) is kept in the compile cache, named after what it
  was made from (the weights, the group, the precision, torch, the CPU), and a later process
  loads it in a fraction of a second.
- Serial code: compiled for one OpenMP thread, so a forked child never meets an OpenMP team it
  did not inherit, and the default layout (a process per core) holds with -compile too.

The output layer and its log-softmax are a program of their own (OutputProgram, fp32 in every
precision but bf16, where the output layer is bf16 and stays uncompiled): the loop asks for a
step's log-probabilities apart from its output, and frozen, its product packed and its softmax
fused, it gives the same values to the bit in 0.75-0.85 of the time (30-160 rows).

With bf16 (``-precision mixed`` or ``bf16``) the layers' products with weights run in bf16, their
results in fp32, as the uncompiled mixed step makes them (bfloat16.py): the attentions, norms,
softmaxes and the cache stay fp32. (Under autocast the attentions' products ran in bf16 too:
97.8% of the Transformer fixture's lines as exact decoding, below -fast's bar of 98%.)

Cache positions past the prefix are masked, and their values weighted by an exact zero; a zero
times a NaN would still be NaN, so the decoder's cache is made with zeroed memory (KVCache's
``zeroed``), its capacity kept within 16 columns of those in use (``tight``; not where only
steps of a few rows run a program).

Nothing here is CPU-only; on a GPU the same program could be exported for CUDA (untested: no
GPU is part of this path's measurements), and CUDA graphs would need shapes that never change:
finished rows kept and masked instead of dropped, and one capacity for the whole batch.
"""
import copy
import functools
import hashlib
import os
import threading
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from onmt_lite.constants import MASKED_LOGIT
from onmt_lite.models import fast
from onmt_lite.models.aot import Builder
from onmt_lite.models.attention import masked_bias
from onmt_lite.models.rnn import padding_mask
from onmt_lite.models.transformer import TransformerEncoder

EXAMPLE_SOURCES, EXAMPLE_LENGTH, EXAMPLE_CAPACITY = 2, 3, 16
# oneDNN keeps a kernel for every bf16 product shape it meets (~0.3 MiB each, bfloat16.py): the
# encoder's products have B x S rows, so sources are padded to a multiple of 8 positions (a
# lane's one-sentence arrivals left it ~100 MiB more of them without, at the same rate)
SOURCE_MULTIPLE = 8
# a step of at most this many rows (a lone sentence's beam) runs a program of its own, with
# inline products (aot.py): the libraries' calls cost more than such products themselves
SMALL_ROWS = 8
BUILDING = threading.Lock()  # one program built at a time (threads of one process share them)


def min_buffer_rows(group: int) -> int:
    """The fewest cache buffer rows a program takes: export traces the rows as two sources or
    more, and the buffer holds every row. A lone sentence's cache gets spare rows."""
    return 2 * group


class StepProgram(nn.Module):
    """What is compiled: one step for rows in blocks of ``group`` per source row. Holds the
    decoder's embeddings, layers and final norm (shared, not copied, but for an int8 model's
    layers: CompiledStep), so their weights become the program's constants.

    forward: tokens (R,) in cache order, positions (R,), the cache's buffer (layers, 2, buffer
    rows >= R, heads, capacity, dim) holding each row's prefix, the memory's keys (B, h, d, S)
    and values (B, h, S, d) of each layer, the source bias (B, h, 1, S); R = group x B. Returns
    the output (R, H), head 0 of the last context attention (R, S) and the step's keys and
    values (layers, 2, R, heads, 1, dim)."""

    def __init__(self, modules: tuple, group: int, bf16: bool):
        super().__init__()
        self.embeddings, self.layers, self.norm = modules  # the decoder's (CompiledStep)
        self.group, self.bf16 = group, bf16

    def forward(self, tokens, positions, buffer, memory: List[torch.Tensor], src_bias):
        emb, rows, bf16 = self.embeddings, tokens.size(0), self.bf16
        torch._check(rows <= buffer.size(2))
        x = emb.embeddings(tokens) * emb.scale + emb.pe.index_select(0, positions)
        x = x.unsqueeze(1)
        later = (torch.arange(buffer.size(4), device=tokens.device)  # not yet written
                 >= positions.unsqueeze(1)).view(rows, 1, 1, -1)
        new, attn = [], None
        for i, layer in enumerate(self.layers):
            q, keys, values = layer.project(x, bf16)  # (R, h, 1, d) each
            new += [keys, values]
            past_keys, past_values = buffer[i, 0, :rows], buffer[i, 1, :rows]  # (R, h, C, d)
            scores = torch.cat([torch.matmul(q, past_keys.transpose(2, 3)).masked_fill(
                later, MASKED_LOGIT), (q * keys).sum(-1, keepdim=True)], dim=-1)
            weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)
            context = torch.matmul(weights[..., :-1], past_values) + weights[..., -1:] * values
            query, q = layer.between(layer.self_attn.merge_heads(context, rows, 1), x, bf16)
            context, attn = layer.context_attention(q, memory[2 * i], memory[2 * i + 1],
                                                    src_bias, self.group)
            x = layer.finish(context, query, bf16)
        out = self.norm(x).squeeze(1)
        new = torch.stack(new).view(len(self.layers), 2, rows, *keys.shape[1:])
        return out, attn[:, 0].reshape(rows, -1), new


class OutputProgram(nn.Module):
    """The output layer and its log-softmax, compiled as a program of their own (frozen: its
    weights packed for MKL's fp32 product, the log-softmax fused; the same values as uncompiled
    to the bit): forward (R, H) -> (log-probabilities (R, V),)."""

    def __init__(self, generator: nn.Linear):
        super().__init__()
        self.generator = generator

    def forward(self, x):
        return (torch.log_softmax(self.generator(x).float(), dim=-1),)


class EncoderProgram(nn.Module):
    """What is compiled of a Transformer encoder: its embeddings, its layers (as
    FastEncoderLayers, ``layers``) and its final norm. forward: src (B, S), src_len (B,) ->
    (memory (B, S, H),)."""

    def __init__(self, encoder, layers: nn.ModuleList, bf16: bool):
        super().__init__()
        self.embeddings, self.layers, self.norm = encoder.embeddings, layers, encoder.layer_norm
        self.bf16 = bf16

    def forward(self, src, src_len):
        emb, length = self.embeddings, src.size(1)
        x = emb.embeddings(src) * emb.scale + emb.pe[:length]
        bias = masked_bias(padding_mask(src_len, length)).unsqueeze(1)  # (B, 1, 1, S)
        for layer in self.layers:
            x = layer(x, bias, self.bf16)
        return (self.norm(x),)


class MemoryProgram(nn.Module):
    """The context attention's keys and values of every decoder layer (FastDecoderLayers), as
    their memory_kv makes them: memory (B, S, H) -> [keys (B, h, d, S), values (B, h, S, d)]
    of each layer in turn."""

    def __init__(self, layers: nn.ModuleList):
        super().__init__()
        self.layers = layers

    def forward(self, memory):
        return [entry for layer in self.layers for entry in layer.memory_kv(memory)]


class Program:
    """A program that ``build`` compiles at its first call (in whichever thread calls first):
    ``make()`` gives the module, example arguments, a function giving their dynamic shapes
    and a name (see Builder). Called with the module's arguments, returns its outputs as a list."""

    def __init__(self, build: Builder, make: Callable[[], tuple]):
        self.build, self.make = build, make
        self.program = None

    def __getstate__(self) -> dict:
        """Pickled without its compiled code and builder (the server's lanes map a model
        written with its programs: attach gives them a builder, which loads the code from the
        compile cache at the first call)."""
        return {"build": None, "make": self.make, "program": None}

    def __call__(self, *args):
        if self.program is None:
            with BUILDING:
                if self.program is None:
                    self.program = self.build(*self.make())
        return self.program(*args)


class CompiledOutput:
    """``model.log_probs`` for a step's rows (R, H) by an OutputProgram compiled at its first
    call; see CompiledStep."""

    def __init__(self, generator: nn.Linear, build: Builder):
        self.generator = generator
        self.program = Program(build, self._make)

    def __call__(self, out: torch.Tensor) -> torch.Tensor:
        return self.program(out.contiguous())[0]

    def _make(self) -> tuple:
        example = torch.zeros(2, self.generator.in_features, device=self.generator.weight.device)
        name = "output-" + _name(_made_of([self.generator]), self.generator.weight.device)

        def shapes():
            return {"x": {0: torch.export.Dim("rows", min=1, max=1 << 20)}}
        return OutputProgram(self.generator).eval(), (example,), shapes, name


class CompiledEncoder:
    """``model.encode`` of a TransformerEncoder by an EncoderProgram compiled at its first call:
    a program instead of some hundred operations (one sentence of 10 tokens, bf16 products:
    0.43 ms against 1.42 uncompiled), which a lone sentence joining a search pays alone.

    Args:
        encoder: the TransformerEncoder (its modules shared, not copied).
        layers: its layers as FastEncoderLayers.
        build, bf16: as CompiledStep's.
    """

    def __init__(self, encoder, layers: nn.ModuleList, build: Builder, bf16: bool = False):
        self.max_len = encoder.embeddings.max_len
        self.pad = encoder.embeddings.embeddings.padding_idx or 0
        self.module = EncoderProgram(encoder, layers, bf16).eval()
        self.program = Program(build, self._make)

    def __call__(self, src: torch.Tensor, src_len: torch.Tensor):
        """src (B, S), src_len (B,) -> memory (B, S, H), None (no final state). The source is
        padded to a multiple of SOURCE_MULTIPLE positions for the program, masked there."""
        length = src.size(1)
        if length > self.max_len:
            raise ValueError(f"sequence longer than {self.max_len} positions")
        padded = min(-(-length // SOURCE_MULTIPLE) * SOURCE_MULTIPLE, self.max_len)
        if padded > length:
            src = nn.functional.pad(src, (0, padded - length), value=self.pad)
        return self.program(src.contiguous(), src_len)[0][:, :length], None

    def _make(self) -> tuple:
        module = self.module
        device = module.embeddings.weight.device
        example = (torch.ones(EXAMPLE_SOURCES, EXAMPLE_LENGTH, dtype=torch.long, device=device),
                   torch.tensor([EXAMPLE_LENGTH, EXAMPLE_LENGTH - 1], device=device))
        made_of = _made_of([module.embeddings, module.layers, module.norm])
        name = "encoder-" + _name(made_of, device, "bf16" if module.bf16 else "fp32")

        def shapes():
            Dim = torch.export.Dim
            b, s = Dim("sources", min=1, max=1 << 16), Dim("source_length", min=1,
                                                             max=self.max_len)
            return {"src": {0: b, 1: s}, "src_len": {0: b}}
        return module, example, shapes, name


def _made_of(modules) -> str:
    """A digest of the weights of ``modules`` and of the code that makes programs."""
    digest = hashlib.blake2b(digest_size=16)
    for module in modules:
        for key, tensor in module.state_dict().items():
            digest.update(key.encode())
            digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8)
                          .numpy().tobytes())
    for path in (__file__, fast.__file__):  # the fast layers the programs trace
        with open(path, "rb") as code:
            digest.update(code.read())
    return digest.hexdigest()


def _name(made_of: str, device: torch.device, *parts: str) -> str:
    """A program's file name: a short hash of what it is made of (``_made_of``), ``parts``,
    torch and the CPU's kernels (or the GPU)."""
    kernels = torch.backends.cpu.get_cpu_capability() if device.type == "cpu" \
        else torch.cuda.get_device_name(device)
    joined = "|".join((made_of, *parts, torch.__version__, kernels, os.uname().machine))
    return hashlib.blake2b(joined.encode(), digest_size=12).hexdigest()


class CompiledStep:
    """``decoder.step`` for a TransformerDecoder whose layers are FastDecoderLayers, by programs
    that ``build`` compiles, one per group met (made at the first step with that group).
    Holds no decoder state: replicas of the decoder (other threads) share its programs.

    With ``few_rows_only`` (``-compile -int8``: int8 products cannot be traced) only steps of
    at most SMALL_ROWS rows run a program, made from fp32 copies of the layers taken now,
    before they are quantised (a model stored in int8: its own values, the int8 ones times
    their scales); at a few rows the library's int8 products cost more than inline fp32 ones.
    The layers' own int8 products make every other step and the memory's keys and values.

    Args:
        decoder: the TransformerDecoder (its modules are shared, not copied).
        build: compiles a StepProgram (see Builder).
        bf16: the layers' products with weights in bf16 inside the program (see product).
        few_rows_only: see above.
    """

    def __init__(self, decoder, build: Builder, bf16: bool = False, few_rows_only: bool = False):
        layers = copy.deepcopy(decoder.layers) if few_rows_only else decoder.layers
        self.decoder_modules = (decoder.embeddings, layers, decoder.layer_norm)
        self.build, self.bf16, self.few_rows_only = build, bf16, few_rows_only
        self.programs: Dict[Tuple[int, bool], Program] = {}  # by group, small
        self.made_of = None  # _made_of the decoder's modules, once
        self.memory_program = None if few_rows_only else Program(build, self._make_memory)

    @staticmethod
    def tiles_first_step(sentences: int) -> bool:
        """Whether a beam's first step on ``sentences`` runs on k rows a sentence: for at most
        SMALL_ROWS sentences, whose one row each would take a program of its own (its weights
        are its own too); the k rows a sentence take those of later steps (a lone sentence:
        35.2 ms against 36.2). A batch's first step on more stays one row a sentence: all of
        them tiled cost 3% (800 lines in batches of 32, beam 5, one thread, the Transformer
        fixture)."""
        return sentences <= SMALL_ROWS

    def takes(self, rows: int) -> bool:
        """Whether a step of ``rows`` rows runs a program (else the decoder's layers)."""
        return rows <= SMALL_ROWS or not self.few_rows_only

    def memory_kv(self, memory: torch.Tensor) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's memory_kv of ``memory`` (B, S, H), by one program."""
        entries = self.memory_program(memory.contiguous())
        return list(zip(entries[::2], entries[1::2]))

    def _make_memory(self) -> tuple:
        _, layers, _ = self.decoder_modules
        device = self.decoder_modules[0].weight.device
        example = torch.zeros(EXAMPLE_SOURCES, EXAMPLE_LENGTH, layers[0].self_attn.heads
                              * layers[0].self_attn.dim_per_head, device=device)

        def shapes():
            Dim = torch.export.Dim
            return {"memory": {0: Dim("sources", min=1, max=1 << 16),
                               1: Dim("source_length", min=1, max=1 << 16)}}
        return MemoryProgram(layers).eval(), (example,), shapes, self.name("memory")

    def __call__(self, decoder, tokens: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """One step of ``decoder`` (its state and cache): tokens (B,) -> out (B, H), attn (B, S)."""
        cache, state = decoder.cache, decoder.state
        positions = state.get("positions")
        if positions is None:
            at = torch.full_like(tokens, decoder.position)
        else:  # rows at positions of their own (joined sentences)
            at = cache.to_buffer(positions)
            cache.length = int(at.max())  # the columns the furthest row has written
        if cache.length + 1 > decoder.embeddings.max_len:
            raise ValueError(f"sequence longer than {decoder.embeddings.max_len} positions")
        cache.reserve(1)
        cache.spare_rows(min_buffer_rows(decoder.group))  # a lone sentence: spare rows
        program = self.program(decoder.group, tokens.size(0) <= SMALL_ROWS, decoder)
        memory = [state[key] for key in decoder.source_keys[1:]]  # keys, values of each layer
        out, attn, new = program(cache.to_buffer(tokens).contiguous(), at, cache.buffer, memory,
                                 state["src_mask"])
        rows = new.size(2)
        if positions is None:
            cache.buffer[:, :, :rows, :, decoder.position:decoder.position + 1] = new
        else:
            cache.buffer[:, :, torch.arange(rows, device=at.device), :, at] = \
                new.squeeze(4).permute(2, 0, 1, 3, 4)
        decoder._advance(1)
        return cache.from_buffer(out), cache.from_buffer(attn)

    def program(self, group: int, small: bool, decoder) -> Program:
        """The program for steps of ``group`` rows per source row; ``small``: at most
        SMALL_ROWS rows, with inline products."""
        program = self.programs.get((group, small))
        if program is None:  # setdefault: threads that meet a group together share one
            program = self.programs.setdefault((group, small), Program(
                self.build, functools.partial(self._make_step, decoder, group, small)))
        return program

    def __getstate__(self) -> dict:
        return dict(vars(self), build=None)  # see Program.__getstate__; attach

    def _make_step(self, decoder, group: int, small: bool) -> tuple:
        args, shapes = self.example(decoder, group)
        name = self.name("step", str(group), "bf16" if self.bf16 and not small else "fp32",
                         *(["inline"] if small else []))
        program = StepProgram(self.decoder_modules, group, self.bf16 and not small)
        return program.eval(), args, shapes, name, small

    @staticmethod
    def example(decoder, group: int):
        """Example arguments for the export (sizes above one: a dimension traced at size 1 is
        fixed at 1) and a function giving their dynamic dimensions."""
        layer = decoder.layers[0]
        heads, dim = layer.self_attn.heads, layer.self_attn.dim_per_head
        device = decoder.embeddings.weight.device
        sources, length = EXAMPLE_SOURCES, EXAMPLE_LENGTH
        rows = group * sources
        zeros = lambda *shape: torch.zeros(shape, device=device)  # noqa: E731
        memory = []
        for _ in decoder.layers:
            memory += [zeros(sources, heads, dim, length), zeros(sources, heads, length, dim)]
        args = (torch.zeros(rows, dtype=torch.long, device=device),
                torch.ones(rows, dtype=torch.long, device=device),
                zeros(len(decoder.layers), 2, rows + 1, heads, EXAMPLE_CAPACITY, dim), memory,
                zeros(sources, heads, 1, length))
        max_len = decoder.embeddings.max_len

        def shapes():
            Dim = torch.export.Dim
            b, s = Dim("sources", min=1, max=1 << 16), Dim("source_length", min=1, max=1 << 16)
            r = b if group == 1 else group * b
            c = Dim("capacity", min=2, max=max_len + EXAMPLE_CAPACITY)
            return {"tokens": {0: r}, "positions": {0: r},
                    "buffer": {2: Dim("buffer_rows", min=min_buffer_rows(group), max=1 << 20),
                               4: c},
                    "memory": [{0: b, 3 - i % 2: s} for i in range(len(memory))],
                    "src_bias": {0: b, 3: s}}
        return args, shapes

    def name(self, kind: str, *parts: str) -> str:
        """The file name of a program of the decoder's: ``kind``, then _name's hash."""
        if self.made_of is None:
            self.made_of = _made_of(self.decoder_modules)
        return f"{kind}-" + _name(self.made_of, self.decoder_modules[0].weight.device, *parts)


def attach(model, build: Builder) -> None:
    """Gives the programs of ``model`` (an NMTModel read back from a file: the server's lanes)
    the builder they lost in pickling (see Program.__getstate__)."""
    step = getattr(model.decoder, "compiled_step", None)
    programs = [part.program for part in (model.compiled_encoder, model.compiled_output)
                if part is not None]
    if step is not None:
        step.build = build
        programs += [step.memory_program, *step.programs.values()]
    for program in programs:
        if program is not None:
            program.build = build


def compile_encoder(encoder: nn.Module, build: Builder,
                    bf16: bool = False) -> Optional[CompiledEncoder]:
    """A Transformer encoder as a program (its layers as FastEncoderLayers) that ``build``
    compiles at the first batch; None for another encoder."""
    if not isinstance(encoder, TransformerEncoder):
        return None
    return CompiledEncoder(encoder, nn.ModuleList(fast.FastEncoderLayer(layer)
                                                  for layer in encoder.layers), build, bf16)
