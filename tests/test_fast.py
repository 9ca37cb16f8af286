"""-fast and -compile: the Transformer decoder step with fused products, compiled where a
compiler is found; the RNN decoder step with its products with the embedding and the memory
folded.

Judged by closeness to exact decoding: equal hypotheses on tiny models, scores within rounding,
and every hypothesis of the fixtures' first 200 lines identical; the compiler's absence is one
warning line.
"""
import json
import logging
import os
import subprocess
import sys
import time

import pytest
import torch
from conftest import SRC_WORDS, TINY_RNNS, TINY_TRANSFORMER, make_model
from parity import FIXTURES, TEST_SRC, available

from onmt_lite.models import aot, compiled_step, fast, inference
from onmt_lite.models.bfloat16 import Bfloat16Linear
from onmt_lite.models.compiled_step import CompiledStep
from onmt_lite.models.inference import for_inference
from onmt_lite.translate import DecodingOptions, Translator, build_translator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARIAN_LIKE = dict(TINY_TRANSFORMER, layer_norm_position="post", add_qkvbias=True,
                   add_ffnbias=True, heads=4)


def _lines(count: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    return [" ".join(SRC_WORDS[int(i)] for i in torch.randint(0, 6, (int(n),), generator=gen))
            for n in torch.randint(1, 12, (count,), generator=gen)]


def _translator(opt, src_vocab, tgt_vocab, on_fast: bool, int8: bool = False, seed: int = 3):
    model = make_model(opt, src_vocab, tgt_vocab, seed)
    if on_fast:  # before quantising, as for_inference does, but uncompiled
        fast.to_fast(model.decoder)
    model = for_inference(model, "cpu", int8=int8)
    return Translator(model, src_vocab, tgt_vocab, DecodingOptions(beam_size=4, n_best=2))


@pytest.mark.parametrize("opt", [TINY_TRANSFORMER, MARIAN_LIKE, *TINY_RNNS.values()],
                         ids=["pre-norm", "post-norm", *TINY_RNNS])
def test_the_fast_step_finds_the_exact_hypotheses(opt, src_vocab, tgt_vocab):
    lines = _lines(40, 1)
    exact = _translator(opt, src_vocab, tgt_vocab, False).translate(lines, tgt=lines,
                                                                    batch_size=7)
    translator = _translator(opt, src_vocab, tgt_vocab, True)
    decoder = translator.model.decoder
    assert isinstance(decoder.layers[0], fast.FastDecoderLayer) if "heads" in opt \
        else isinstance(decoder.attn, fast.FoldedGlobalAttention)
    if opt.get("rnn_type") == "LSTM":
        assert isinstance(decoder.rnn.layers[1], fast.JoinedLSTMCell)
    quick = translator.translate(lines, tgt=lines, batch_size=7)
    for a, b in zip(exact, quick):
        assert a.preds == b.preds
        assert a.scores == pytest.approx(b.scores, abs=1e-4)
        assert a.gold_score == pytest.approx(b.gold_score, abs=1e-4)  # teacher forcing
        for attn_a, attn_b in zip(a.attns, b.attns):
            assert torch.allclose(attn_a, attn_b, atol=1e-5)


@pytest.mark.parametrize("rnn", ["LSTM", "GRU"])
def test_an_rnn_embedding_table_beyond_the_limit_is_not_made(rnn, src_vocab, tgt_vocab,
                                                             monkeypatch):
    opt = TINY_RNNS[f"{'brnn' if rnn == 'LSTM' else 'rnn'}-{rnn}-general"]
    model = for_inference(make_model(opt, src_vocab, tgt_vocab), "cpu")
    exact = Translator(model, src_vocab, tgt_vocab, DecodingOptions(beam_size=3))
    lines = _lines(10, 4)
    expected = [t.preds for t in exact.translate(lines)]
    monkeypatch.setattr(fast, "MAX_TABLE_BYTES", 0)
    decoder = fast.to_fast(model.decoder)
    assert type(decoder.rnn.layers[0]) is {"LSTM": torch.nn.LSTMCell, "GRU": torch.nn.GRUCell}[rnn]
    assert decoder.embeddings.weight.size(1) == opt["word_vec_size"]
    assert [t.preds for t in exact.translate(lines)] == expected


def test_the_fused_weights_are_the_three_projections(src_vocab, tgt_vocab):
    model = make_model(MARIAN_LIKE, src_vocab, tgt_vocab)
    layer = model.decoder.layers[0]
    quick = fast.FastDecoderLayer(layer)
    x = torch.randn(5, 1, 16)
    q, k, v = quick.project(x)
    attn = layer.self_attn
    assert torch.allclose(q, attn.project_query(x), atol=1e-6)
    assert torch.allclose(k, attn.project_kv(x)[0], atol=1e-6)
    assert torch.allclose(v, attn.project_kv(x)[1], atol=1e-6)


def test_fast_and_int8_together(src_vocab, tgt_vocab):
    lines = _lines(20, 2)
    int8 = _translator(TINY_TRANSFORMER, src_vocab, tgt_vocab, False, int8=True)
    both = _translator(TINY_TRANSFORMER, src_vocab, tgt_vocab, True, int8=True)
    assert [t.preds for t in int8.translate(lines)] == [t.preds for t in both.translate(lines)]


@pytest.mark.parametrize("inter_threads", [1, 2])
def test_int8_products_are_not_searched_for_overrides(src_vocab, tgt_vocab, inter_threads,
                                                     monkeypatch):
    """Every decoder step runs in inference mode with subclass overrides off, on each thread:
    torch would otherwise look for __torch_function__ on an int8 product's packed weights (a
    TorchScript object) at every call."""
    translator = _translator(TINY_TRANSFORMER, src_vocab, tgt_vocab, True, int8=True)
    translator.inter_threads = inter_threads
    seen, step = set(), type(translator.model.decoder).step

    def recording_step(decoder, tokens):
        seen.add((torch.is_inference_mode_enabled(), torch._C._is_torch_function_enabled()))
        return step(decoder, tokens)

    monkeypatch.setattr(type(translator.model.decoder), "step", recording_step)
    translator.translate(_lines(12, 4), batch_size=3)
    assert seen == {(True, False)}
    assert torch._C._is_torch_function_enabled()  # and on again after


@pytest.mark.parametrize("opt", [TINY_TRANSFORMER, MARIAN_LIKE], ids=["pre-norm", "post-norm"])
def test_the_whole_step_finds_the_fast_steps_hypotheses(opt, src_vocab, tgt_vocab, monkeypatch):
    """The function -compile compiles (run uncompiled here: the same operations), where fresh
    memory is all NaN: later positions masked, their values weighted by zero, the cache's
    buffers zeroed. The fast step's hypotheses, scores and attention, with and without target
    prefixes (their steps run through the layers, then the whole step goes on)."""
    lines = _lines(30, 6)
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: empty(*a, **k).fill_(float("nan")))
    results = []
    for whole in (False, True):
        translator = _translator(opt, src_vocab, tgt_vocab, True)
        decoder = translator.model.decoder
        if whole:
            decoder.compiled_step = CompiledStep(decoder, lambda program, *_: program)
            translator.translate(lines[:1])
            assert decoder.cache.new is torch.zeros
        results.append([translator.translate(lines, batch_size=size) for size in (1, 4, 9)])
        translator.opt.tgt_file_prefix = True
        results[-1].append(translator.translate(lines, tgt=lines[::-1], batch_size=4))
    for a, b in zip(sum(results[0], []), sum(results[1], [])):
        assert a.preds == b.preds
        assert a.scores == pytest.approx(b.scores, abs=1e-4)
        for attn_a, attn_b in zip(a.attns, b.attns):
            assert torch.allclose(attn_a, attn_b, atol=1e-5)


def test_the_whole_step_takes_rows_at_positions_of_their_own(src_vocab, tgt_vocab):
    """Rows at different positions share a step of the program (as sentences that join a
    running search): two sentences decoded side by side, then one of them set two positions
    back, take two more steps; each row's output equals its sentence's step alone after as
    many tokens, so each row read its own prefix and wrote its keys and values at its own
    position."""
    model = make_model(TINY_TRANSFORMER, src_vocab, tgt_vocab, 5)
    decoder = fast.to_fast(model.decoder)
    decoder.compiled_step = CompiledStep(decoder, lambda program, *_: program)
    src = torch.tensor([[4, 5, 6, 7], [8, 9, 1, 1]])  # 1: padding
    src_len = torch.tensor([4, 2])
    first = [[2, 6, 8, 5, 7], [5, 7, 9]]  # side by side: a token a step, each sentence
    then = [[5, 7], [4, 6]]  # then sentence 1 two positions back: positions 3, 4 and 1, 2
    with torch.inference_mode():
        alone = []
        for row in (0, 1):
            memory, _ = model.encode(src[row:row + 1, :int(src_len[row])], src_len[row:row + 1])
            decoder.init_state(src_len[row:row + 1], memory)
            sequence = first[row][:3 if row == 0 else 1] + then[row]
            alone.append([decoder.step(torch.tensor([t]))[0] for t in sequence][-2:])
        memory, _ = model.encode(src, src_len)
        decoder.init_state(src_len, memory)
        for i in range(3):
            decoder.step(torch.tensor([first[0][i], first[1][i]]))
        decoder.state["positions"] = torch.tensor([3, 1])
        decoder.cache.own_positions()
        joined = [decoder.step(torch.tensor([then[0][i], then[1][i]]))[0] for i in range(2)]
        decoder.embeddings.max_len = 5  # the furthest row, at position 5, past the table
        with pytest.raises(ValueError, match="longer than 5 positions"):
            decoder.step(torch.tensor([4, 4]))
    for i in range(2):
        assert torch.allclose(joined[i][0], alone[0][i][0], atol=1e-5)
        assert torch.allclose(joined[i][1], alone[1][i][0], atol=1e-5)


def test_a_few_rows_step_through_a_program_with_inline_products(src_vocab, tgt_vocab):
    """A step of at most SMALL_ROWS rows (a lone sentence's beam) runs a program of its own,
    built with inline products and in fp32 (bf16 rounding buys nothing at a few rows); more
    rows run the other, in the step's precision. One program per group and kind."""
    translator = _translator(TINY_TRANSFORMER, src_vocab, tgt_vocab, True)
    decoder = translator.model.decoder
    built, names = [], set()

    def build(program, args, shapes, name, inline=False):
        if isinstance(program, compiled_step.StepProgram):
            built.append((program.group, inline, program.bf16))
            names.add(name)
        return program
    decoder.compiled_step = CompiledStep(decoder, build, bf16=True)
    lines = _lines(8, 4)
    translator.translate(lines[:1])  # rows: 4 (beam 4; the first step's rows tiled before it)
    translator.translate(lines[:3], batch_size=3)  # 12
    translator.translate(lines, batch_size=8)  # 32: nothing new
    assert sorted(built) == [(4, False, True), (4, True, False)]
    assert len(names) == 2 and compiled_step.SMALL_ROWS == 8


def test_inline_products_take_the_template_only_while_building_such_a_program():
    """Inductor's choices for a product while a program with inline products is built: its
    C++ template's alone where it has one (so nothing is timed), else every choice; outside
    such a build, every choice."""
    class Choice:
        def __init__(self, name):
            self.name = name
    library, template = Choice("_linear_pointwise"), Choice("cpp_CppMicroGemmFP32Vec_0")
    assert aot._template_first([library, template]) == [library, template]
    with aot._inline_products(True):
        assert aot._template_first([library, template]) == [template]
        assert aot._template_first([library]) == [library]
    with aot._inline_products(False):
        assert aot._template_first([library, template]) == [library, template]
    assert aot._template_first([library, template]) == [library, template]


def test_the_whole_step_in_bf16_rounds_its_products(src_vocab, tgt_vocab):
    """-compile in bf16: the layers' products inside the step in bf16, so scores move by bf16
    rounding, not more; the cache stays fp32."""
    lines = _lines(20, 9)
    scores = []
    for bf16 in (False, True):
        translator = _translator(TINY_TRANSFORMER, src_vocab, tgt_vocab, True)
        decoder = translator.model.decoder
        decoder.compiled_step = CompiledStep(decoder, lambda program, *_: program, bf16=bf16)
        translator.opt.tgt_file_prefix = True  # forced: the same tokens, comparable scores
        scores.append([t.scores[0] for t in translator.translate(lines, tgt=lines, batch_size=5)])
        assert decoder.cache.buffer.dtype == torch.float32
    differences = [abs(a - b) for a, b in zip(*scores)]
    assert 0 < max(differences) < 0.1


MARIAN_GELU = dict(MARIAN_LIKE, pos_ffn_activation_fn="gelu", scale_embedding=False,
                   position_encoding_type="SinusoidalMarian")


@pytest.mark.parametrize("opt", [TINY_TRANSFORMER, MARIAN_LIKE, MARIAN_GELU],
                         ids=["pre-norm", "post-norm", "post-norm-gelu"])
def test_the_source_programs_are_the_encoder_and_the_layers(opt, src_vocab, tgt_vocab):
    """-compile's encoder program and memory program (run uncompiled here: the same operations)
    give the encoder's memory at every position of a padded batch and of a lone sentence (the
    programs take sources padded to 8 positions), and each decoder layer's keys and values of
    it; with bf16 products, the memory moves by bf16 rounding, not more."""
    model = make_model(opt, src_vocab, tgt_vocab, 4)
    decoder = fast.to_fast(model.decoder)
    step = CompiledStep(decoder, lambda program, *_: program)
    src = torch.tensor([[4, 5, 6, 7, 8], [8, 9, 4, 1, 1], [5, 1, 1, 1, 1]])  # 1: padding
    src_len = torch.tensor([5, 3, 1])
    lengths = []  # of the sources the programs are given

    def build(program, *_):
        return lambda src, src_len: lengths.append(src.size(1)) or program(src, src_len)
    programs = {bf16: compiled_step.compile_encoder(model.encoder, build, bf16) for bf16 in (False, True)}
    with torch.inference_mode():
        for rows, length in ((slice(0, 3), 5), (slice(2, 3), 1)):
            expected, _ = model.encoder(src[rows, :length], src_len[rows])
            memory, final = programs[False](src[rows, :length], src_len[rows])
            assert final is None and torch.allclose(memory, expected, atol=1e-5)
            rounded, _ = programs[True](src[rows, :length], src_len[rows])
            assert 0 < (rounded - expected).abs().max() < 0.1
            for (keys, values), layer in zip(step.memory_kv(memory), decoder.layers):
                assert all(torch.equal(a, b) for a, b in zip((keys, values),
                                                             layer.memory_kv(memory)))
        assert lengths == [8] * 4  # padded to SOURCE_MULTIPLE: few product shapes (oneDNN)
        programs[False].max_len = 4  # a source past the position table, as the encoder says
        with pytest.raises(ValueError, match="longer than 4 positions"):
            programs[False](src, src_len)


@pytest.mark.parametrize("precision", ["mixed", "bf16"])
def test_compiled_programs_make_their_own_bf16_products(precision, src_vocab, tgt_vocab,
                                                        monkeypatch):
    """With -compile the encoder and the decoder keep their fp32 weights for their programs,
    which round their products to bf16 themselves; the output layer is bf16 only in bf16."""
    monkeypatch.setattr(aot, "aot_compiler", lambda *_: lambda program, *_: program)
    model = make_model(TINY_TRANSFORMER, src_vocab, tgt_vocab, 3)
    model = for_inference(model, "cpu", precision=precision, compile=True)
    assert model.compiled_encoder.module.bf16 and model.decoder.compiled_step.bf16
    assert all(type(m) is not Bfloat16Linear for part in (model.encoder, model.decoder)
               for m in part.modules())
    assert (type(model.generator) is Bfloat16Linear) == (precision == "bf16")


def test_compile_with_int8_compiles_the_steps_of_a_few_rows_from_fp32_copies(src_vocab, tgt_vocab,
                                                                           monkeypatch):
    """-compile -int8: int8 products cannot be traced, so the layers keep them (the encoder, the
    memory's keys and values, the output layer and every step of more than SMALL_ROWS rows),
    and a step of at most SMALL_ROWS rows runs a program made from fp32 copies of the layers
    taken before they were quantised (run uncompiled here). Given the same memory entries, a
    step of 2 rows is the fp32 fast step's, one of 9 rows the int8 fast step's."""
    monkeypatch.setattr(aot, "aot_compiler", lambda *_: lambda program, *_: program)

    def model(**options):
        return for_inference(make_model(TINY_TRANSFORMER, src_vocab, tgt_vocab, 3), "cpu",
                             **options)
    hybrid = model(int8=True, compile=True)
    step = hybrid.decoder.compiled_step
    assert step.few_rows_only and hybrid.compiled_encoder is hybrid.compiled_output is None
    assert isinstance(hybrid.decoder.layers[0].qkv, fast.DynamicQuantizedLinear)
    assert type(step.decoder_modules[1][0].qkv) is torch.nn.Linear
    assert step.memory_program is None and not step.takes(compiled_step.SMALL_ROWS + 1)
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for sentences, reference in ((2, model(fast=True, precision="fp32")),
                                     (9, model(int8=True, fast=True))):
            memory = torch.randn(sentences, 5, 16, generator=gen)
            src_len = torch.tensor([5, 3] * (sentences // 2) + [4] * (sentences % 2))
            hybrid.decoder.init_state(src_len, memory)
            reference.decoder.init_state(src_len, memory)
            reference.decoder.state.update({key: value for key, value in
                                            hybrid.decoder.state.items() if "memory" in key})
            for token in (2, 5, 7):
                tokens = torch.full((sentences,), token)
                (ours, attn), (theirs, attn_theirs) = (hybrid.decoder.step(tokens),
                                                       reference.decoder.step(tokens))
                assert torch.allclose(ours, theirs, atol=1e-5)
                assert torch.allclose(attn, attn_theirs, atol=1e-6)
    assert sorted(step.programs) == [(1, True)]


@pytest.mark.parametrize("int8", [False, True], ids=["compiled", "compiled int8"])
def test_a_compiled_model_written_for_the_lanes_loads_its_programs_again(tmp_path, monkeypatch,
                                                                        int8):
    """The server writes a -compile model to a file the lanes map: its programs go without
    their code and builder, and attach_programs gives them a builder again (in a lane: one
    that loads the code from the compile cache); the translations are the model's."""
    from conftest import tiny_checkpoint
    built = []

    def build(program, *_):
        built.append(type(program).__name__)
        return program
    monkeypatch.setattr(aot, "aot_compiler", lambda cache_dir="", build_missing=True: build)
    monkeypatch.setattr(inference, "mkl_is_slow", lambda: False)  # oneDNN's packed weights
    # cannot be written: such a model is built by each lane
    translator = build_translator({"model": tiny_checkpoint(tmp_path / "tiny.pt"), "beam_size": 3,
                                   "compile": True, "int8": int8})
    lines = _lines(12, 3)
    expected = [t.output_lines() for t in translator.translate(lines, batch_size=2)]
    torch.save(translator, tmp_path / "written.pt")
    loaded = torch.load(tmp_path / "written.pt", mmap=True, weights_only=False)
    step = loaded.model.decoder.compiled_step
    assert step.build is None and all(p.build is None and p.program is None
                                      for p in step.programs.values())
    inference.attach_programs(loaded.model)
    count = len(built)
    assert [t.output_lines() for t in loaded.translate(lines, batch_size=2)] == expected
    assert len(built) > count and step.few_rows_only == int8  # 6 rows: a program's, int8 too


def test_without_a_compiler_the_step_runs_uncompiled_after_one_line(caplog):
    from torch._inductor import config
    # config.patch, not monkeypatch: monkeypatch's undo deletes the setting (hidden from then
    # on in this process) where torch's config module gives it through __getattr__
    with config.patch({"cpp.cxx": (None, "no-such-c++-compiler")}):
        assert "no C++ compiler found" in aot.compiler_problem()
        with caplog.at_level(logging.WARNING, logger="onmt_lite"):
            assert aot.aot_compiler() is None
    assert "no-such" not in (aot.compiler_problem() or "")  # the setting is back
    assert [r.getMessage() for r in caplog.records] == [
        "-compile: no C++ compiler found (looked for no-such-c++-compiler; set CXX to one): the "
        "model runs uncompiled"]


def test_a_step_torch_cannot_compile_runs_uncompiled_after_one_line(tmp_path, monkeypatch,
                                                                     caplog):
    """Where torch cannot export or compile the step (seen on CUDA with torch 2.11), one line
    says so and the translations are the uncompiled step's."""
    from conftest import tiny_checkpoint
    model = tiny_checkpoint(tmp_path / "tiny.pt")

    def failing(program, args, shapes, name):
        raise RuntimeError("prims::convert_element_type() Expected a value of type 'Tensor'")
    monkeypatch.setattr(aot, "aot_compiler", lambda cache_dir="", build_missing=True: failing)
    lines = ["a b c", "d e f a"]
    with caplog.at_level(logging.WARNING, logger="onmt_lite"):
        translator = build_translator({"model": model, "compile": True, "beam_size": 3})
    assert [r.getMessage() for r in caplog.records] == [
        "-compile: torch could not compile the model's programs on cpu (RuntimeError: "
        "prims::convert_element_type() Expected a value of type 'Tensor'): they run uncompiled"]
    assert translator.model.decoder.compiled_step is translator.model.compiled_encoder is None
    plain = build_translator({"model": model, "beam_size": 3})
    assert [t.output_lines() for t in translator.translate(lines)] == [
        t.output_lines() for t in plain.translate(lines)]


def test_the_command_line_without_a_compiler(tmp_path):
    """A machine without a compiler: one line says so, and -compile translates every line."""
    from conftest import tiny_checkpoint
    model = tiny_checkpoint(tmp_path / "tiny.pt")
    src = tmp_path / "in.txt"
    src.write_text("a b c\n\nd e f a\n")
    out = tmp_path / "out.txt"
    env = dict(os.environ, CXX="/no/such/compiler")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "translate.py"), "-model", model,
                           "-src", src, "-output", out, "-compile", "-beam_size", "3"],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "-compile: no C++ compiler found (looked for /no/such/compiler" in proc.stderr
    assert len(out.read_text().split("\n")) == 4  # three lines, the empty one kept


COMPILE_RUN = """
import json, sys, torch
from onmt_lite.translate import build_translator
translator = build_translator({"model": sys.argv[1], "compile": True, "beam_size": 3,
                               "compile_cache": sys.argv[2], "precision": "fp32"})
torch.set_num_threads(1)
lines = [l.strip() for l in open(sys.argv[3])]
out = [t.preds for size in (1, 3, 8) for t in translator.translate(lines, batch_size=size)]
print(json.dumps({"preds": out, "programs": sorted(translator.model.decoder.compiled_step.programs)}))
"""


@pytest.mark.skipif(aot.compiler_problem() is not None, reason="no C++ compiler here")
def test_one_compilation_serves_every_shape_and_later_processes(tmp_path, src_vocab, tgt_vocab):
    """Batches of 1, 3 and 8 sentences of many lengths are served by three step programs (one
    row a sentence at the first step of more than SMALL_ROWS sentences, the warm-up's nine;
    three rows a sentence after it, and at the first step of fewer, tiled before it: one for
    at most SMALL_ROWS rows, its products inline, and one for more), one of the output layer,
    one of
    the encoder and one of the memory's keys and values, compiled by a
    first process (built at load, by the warm-up); a command line run loads them from the
    cache directory and decodes in its default layout (forked processes, where the machine
    has two cores: the compiled code is serial, so a child never waits on OpenMP threads it
    did not inherit); both find the uncompiled step's hypotheses."""
    from conftest import TINY_TRANSFORMER, tiny_checkpoint
    # one layer each: a program's export and lowering grow with its layers (CI's longest test)
    model = tiny_checkpoint(tmp_path / "tiny.pt",
                            opt={**TINY_TRANSFORMER, "enc_layers": 1, "dec_layers": 1})
    src, out, cache = tmp_path / "in.txt", tmp_path / "out.txt", tmp_path / "cache"
    src.write_text("".join(line + "\n" for line in _lines(17, 5)))
    proc = subprocess.run([sys.executable, "-c", COMPILE_RUN, model, cache, src],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    first = json.loads(proc.stdout.strip().splitlines()[-1])
    made = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "translate.py"), "-model", model,
                           "-src", src, "-output", out, "-compile", "-compile_cache", cache,
                           "-precision", "fp32", "-beam_size", "3", "-batch_size", "3"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert first["programs"] == [[1, False], [3, False], [3, True]]
    assert sorted(name.split("-")[0] for name in made) == [
        "encoder", "memory", "output", "step", "step", "step"]
    assert made == {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    uncompiled = build_translator({"model": model, "beam_size": 3, "precision": "fp32"})
    fast.to_fast(uncompiled.model.decoder)
    lines = src.read_text().split("\n")[:-1]
    expected = [t.preds for size in (1, 3, 8) for t in uncompiled.translate(lines, batch_size=size)]
    assert first["preds"] == expected
    assert out.read_text().split("\n")[:-1] == [" ".join(t.preds[0]) for t in
                                                uncompiled.translate(lines, batch_size=3)]
    uncompiled.opt.max_length_ratio, uncompiled.opt.max_length = 0, 24
    _served_with_the_compiled_programs(model, cache, lines, made, [
        " ".join(t.preds[0]) for t in uncompiled.translate(lines, batch_size=1)])


def _served_with_the_compiled_programs(model, cache, lines, made, expected):
    """The server's lanes load the programs too (from its first build: the cache holds them,
    so it does not start on the uncompiled path): one-sentence requests from 8 clients
    join each other's searches between steps, through the compiled step, and each gets the line
    the uncompiled step finds for it alone."""
    server = _compile_server(model, "-compile_cache", str(cache))
    try:
        _wait_for_line(server, "its compiled programs are ready", 120)
        answers = _answers(server, lines * 3)
        compiled = _compiled_metric(server)
        log = "".join(server.log)
    finally:
        server.stop()
    assert compiled == "1.0"
    assert "its compiled programs are ready (from the compile cache)" in log, log
    assert "answers uncompiled meanwhile" not in log, log
    assert answers == expected * 3
    assert made == {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}


def _compile_server(model, *options, env=None):
    pytest.importorskip("fastapi", reason="the server needs the serve extra (fastapi)")
    from test_serve import Server
    return Server("-compile", "-precision", "fp32", "-beam_size", "3", "-max_length_ratio", "0",
                  "-max_length", "24", *options, model=model, start_s=300, env=env)


def _answers(server, lines):
    from concurrent.futures import ThreadPoolExecutor

    import httpx
    with httpx.Client(base_url=server.url, timeout=120) as http, ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda line: http.post("/translator/translate", json=[
            {"src": line, "id": 0}]).json()[0][0]["tgt"], lines))


def _compiled_metric(server) -> str:
    import httpx
    text = httpx.get(server.url + "/metrics").text
    return next(line.split()[-1] for line in text.splitlines()
                if line.startswith('onmt_lite_model_compiled{model="0"}'))


def _wait_for_line(server, text: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not any(text in line for line in server.log):
        assert time.monotonic() < deadline, "".join(server.log)
        assert server.process.poll() is None, "".join(server.log)
        time.sleep(0.1)


def _uncompiled_lines(model, lines):
    uncompiled = build_translator({"model": model, "beam_size": 3, "precision": "fp32",
                                   "max_length_ratio": 0, "max_length": 24})
    fast.to_fast(uncompiled.model.decoder)
    return [" ".join(t.preds[0]) for t in uncompiled.translate(lines, batch_size=1)]


@pytest.mark.skipif(aot.compiler_problem() is not None, reason="no C++ compiler here")
def test_a_compile_server_answers_uncompiled_while_its_programs_are_built(tmp_path):
    """With an empty compile cache, building the programs takes a minute or more: the server
    is ready in seconds and answers on the uncompiled fast path meanwhile, the programs built
    in a process of their own, which ends, without an error, when the model is unloaded."""
    from conftest import tiny_checkpoint
    model = tiny_checkpoint(tmp_path / "tiny.pt")
    lines = _lines(6, 7)
    start = time.monotonic()
    server = _compile_server(model, "-compile_cache", str(tmp_path / "cache"))
    try:
        ready = time.monotonic() - start
        answers = _answers(server, lines)
        compiled = _compiled_metric(server)
        log = "".join(server.log)
        children = _children(server)
        import httpx
        assert httpx.get(server.url + "/translator/unload_model/0").status_code == 200
        deadline = time.monotonic() + 30
        while _children(server).count("multiprocessing.spawn") > 2:
            assert time.monotonic() < deadline, _children(server)
            time.sleep(0.1)
        time.sleep(0.5)  # the thread that waited for it has seen its end
        after = "".join(server.log)
    finally:
        server.stop()
    assert "ERROR" not in after, after
    assert ready < 30, log
    assert "its programs are built (or loaded from the compile cache) beside it; it answers " \
        "uncompiled meanwhile" in log
    assert "its compiled programs are ready" not in log and compiled == "0.0"
    assert answers == _uncompiled_lines(model, lines)
    assert children.count("multiprocessing.spawn") == 3, children  # two lanes and the builder


STORED_INT8 = os.path.join(ROOT, "tests", "reference", "ct2_tiny", "prenorm_int8")
STORED_FP32 = os.path.join(ROOT, "tests", "reference", "ct2_tiny", "prenorm_float32")


def test_the_server_compiles_a_model_stored_in_int8_by_default(tmp_path, monkeypatch):
    """The server's first build of a model stored in int8, its int8 default applied, loads only
    the programs the compile cache holds (none here): it is served uncompiled and its programs
    are to be built beside it. Not so for an fp32 model, int8 asked for (-int8), no C++
    compiler here, or translate.py (which never waits a minute for a compiler unasked)."""
    from onmt_lite.serve import building

    def first(model, **options):
        options = dict({"model": model, "compile_cache": str(tmp_path / "cache"),
                        "compile_stored_int8": True, "given_options": frozenset()}, **options)
        return building._built(building.first_build(options), str(tmp_path / "w"), "m")
    built = first(STORED_INT8)
    assert built.compile_later and not built.compiled and built.path is not None
    assert not first(STORED_FP32).compile_later
    assert not first(STORED_INT8, int8=True, given_options=frozenset({"int8"})).compile_later
    assert not build_translator({"model": STORED_INT8}).compiles
    monkeypatch.setattr(aot, "compiler_problem", lambda: "no C++ compiler found")
    assert not first(STORED_INT8).compile_later


@pytest.mark.skipif(aot.compiler_problem() is not None, reason="no C++ compiler here")
def test_a_server_answers_a_model_stored_in_int8_uncompiled_while_its_programs_are_built(
        tmp_path):
    """No -compile given: a model stored in int8 is served at once on its uncompiled int8 path,
    translate.py's answers, while a process of its own builds its programs. (One request at a
    time: an int8 product quantises its input over all its rows, so a sentence's answer
    depends on those decoded beside it.)"""
    pytest.importorskip("fastapi", reason="the server needs the serve extra (fastapi)")
    import httpx
    from test_serve import Server
    lines = ["man dog cat dog with near park", "man", "in bike the", "dog red blue"]
    server = Server("-compile_cache", str(tmp_path / "cache"), "-max_length", "24",
                    model=STORED_INT8, start_s=300)
    try:
        answers = [httpx.post(server.url + "/translator/translate", json=[{"src": line, "id": 0}],
                              timeout=120).json()[0][0]["tgt"] for line in lines]
        compiled = _compiled_metric(server)
        log = "".join(server.log)
        children = _children(server)
    finally:
        server.stop()
    assert "stored in int8: it decodes on the fast path, compiled, with its own int8" in log
    assert "beside it; it answers uncompiled meanwhile" in log and compiled == "0.0"
    expected = [t.output_lines()[0] for t in build_translator(
        {"model": STORED_INT8, "max_length": 24}).translate(lines, batch_size=1)]
    assert answers == expected
    assert children.count("multiprocessing.spawn") == 3, children  # two lanes and the builder


def _children(server) -> str:
    return subprocess.run(["ps", "--ppid", str(server.process.pid), "-o", "args="],
                          capture_output=True, text=True).stdout


def test_a_compile_server_without_a_compiler_answers_uncompiled(tmp_path):
    """Without a compiler, the process that builds the programs says so in one line and
    ends; the server decodes uncompiled and says nothing more."""
    from conftest import tiny_checkpoint
    model = tiny_checkpoint(tmp_path / "tiny.pt")
    lines = _lines(6, 8)
    server = _compile_server(model, env=dict(os.environ, CXX="/no/such/compiler"))
    try:
        _wait_for_line(server, "-compile: no C++ compiler found (looked for /no/such/compiler",
                       60)
        time.sleep(1)  # its end is seen
        answers = _answers(server, lines)
        log = "".join(server.log)
    finally:
        server.stop()
    assert "its compiled programs are ready" not in log and "failed" not in log, log
    assert answers == _uncompiled_lines(model, lines)


@pytest.mark.skipif(not available(), reason="../shared/fixtures/onmt-py is absent")
@pytest.mark.parametrize("name", ["transformer", "rnn"])
def test_the_fixture_keeps_its_lines_on_the_fast_path(name):
    """Every line of the first 200 keeps its 5 best hypotheses, in order, on the fast path in
    fp32, their scores within rounding (here within 2e-6)."""
    with open(TEST_SRC, encoding="utf-8") as f:
        lines = [next(f).strip() for _ in range(200)]
    model = os.path.join(FIXTURES, f"{name}.pt")
    exact = build_translator({"model": model, "beam_size": 5, "n_best": 5})
    quick = build_translator({"model": model, "beam_size": 5, "n_best": 5, "fast": True,
                              "precision": "fp32"})
    a = exact.translate(lines, batch_size=32)
    b = quick.translate(lines, batch_size=32)
    for number, (x, y) in enumerate(zip(a, b), 1):
        assert x.preds == y.preds, number
        assert x.scores == pytest.approx(y.scores, abs=1e-4), number
    assert len(a) == len(b) == len(lines)


def test_the_warm_up_leaves_seeded_sampling_and_prefixes_as_they_were(tmp_path):
    """-compile decodes dummy batches at load: a seeded sample draws the same afterwards, and a
    run with target prefixes warms up too."""
    from conftest import tiny_checkpoint
    model = tiny_checkpoint(tmp_path / "tiny.pt")
    lines = _lines(6, 7)
    options = {"model": model, "beam_size": 1, "random_sampling_topk": -1, "seed": 4}
    plain = build_translator(options)
    warmed = build_translator(options)
    warmed.warm_up()
    assert [t.preds for t in plain.translate(lines)] == [t.preds for t in warmed.translate(lines)]
    prefixed = build_translator({"model": model, "beam_size": 2, "tgt_file_prefix": True})
    prefixed.warm_up()
    assert len(prefixed.translate(lines, tgt=["A B"] * 6)) == 6


def test_the_fast_cpu_preset_translates_every_line(tmp_path):
    from conftest import tiny_checkpoint
    model = tiny_checkpoint(tmp_path / "tiny.pt")
    src = tmp_path / "in.txt"
    src.write_text("".join(line + "\n" for line in _lines(9, 8)) + "\n")
    out = tmp_path / "out.txt"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "translate.py"), "-config",
                           os.path.join(ROOT, "configs", "fast_int8_cpu.yaml"), "-model", model,
                           "-src", src, "-output", out], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert len(out.read_text().split("\n")) == 11  # ten lines, the empty one kept


def test_fast_layers_hold_no_state_between_threads(src_vocab, tgt_vocab):
    """-inter_threads decodes batches at once on replicas sharing the fast layers."""
    model = make_model(TINY_TRANSFORMER, src_vocab, tgt_vocab, seed=2)
    fast.to_fast(model.decoder)
    model = for_inference(model, "cpu")
    lines = _lines(30, 9)
    one, two = (Translator(model, src_vocab, tgt_vocab, DecodingOptions(beam_size=3),
                           inter_threads=n) for n in (1, 2))
    assert [t.preds for t in one.translate(lines, batch_size=4)] == \
        [t.preds for t in two.translate(lines, batch_size=4)]


def test_tanh_from_a_sigmoid_is_tanh_within_rounding():
    x = torch.cat([torch.linspace(-60, 60, 2001), torch.randn(1000)])
    kept = x.clone()
    assert torch.allclose(fast.sigmoid_tanh(x), torch.tanh(x), rtol=0, atol=3e-7)
    assert torch.equal(x, kept)  # its input untouched
    assert fast.sigmoid_tanh(torch.tensor([-60.0, 0.0, 60.0])).tolist() == [-1.0, 0.0, 1.0]


def test_a_product_without_the_module_call_is_the_module_call():
    import warnings
    torch.manual_seed(0)
    linear, cell = torch.nn.Linear(8, 5), torch.nn.LSTMCell(8, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        int8 = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(linear),
                                                      {torch.nn.Linear}, dtype=torch.qint8)[0]
    x = torch.randn(3, 8)
    assert torch.equal(fast.product(linear, x), linear(x))
    assert torch.equal(fast.product(int8, x), int8(x))
    assert not torch.equal(int8(x), linear(x))  # the int8 branch is not F.linear
    assert torch.equal(fast.product(cell, x)[0], cell(x)[0])  # any other module: its call
    for module in (linear, int8):  # int8: the relu inside the product
        assert torch.equal(fast.product(module, x, relu=True), torch.relu(module(x)))
        assert (fast.product(module, x, relu=True) == 0).any()


@pytest.mark.parametrize("length", [1, 3])
def test_the_context_attention_is_the_multi_headed_attention(length, src_vocab, tgt_vocab):
    """Transposed keys and the mask as a bias inside the product: the contexts and weights of
    MultiHeadedAttention, for a group of rows per source row."""
    from onmt_lite.models.rnn import padding_mask
    layer = make_model(MARIAN_LIKE, src_vocab, tgt_vocab).decoder.layers[0]
    quick, attn = fast.FastDecoderLayer(layer), layer.context_attn
    memory, group = torch.randn(3, 7, 16), 2
    queries = torch.randn(3 * group, length, 16)  # the scaled queries, heads not split
    for src_len in ([7, 4, 2], [3, 7, 5]):
        mask = padding_mask(torch.tensor(src_len), 7).unsqueeze(1)
        context, weights = quick.context_attention(queries, *quick.memory_kv(memory),
                                                   quick.source_mask(mask), group)
        expected, expected_weights = attn.attention(attn.split_heads(queries),
                                                    *attn.project_kv(memory), mask, group)
        assert torch.allclose(context, attn.merge_heads(expected, 3 * group, length), atol=1e-6)
        assert torch.allclose(weights, expected_weights, atol=1e-6)
        assert (weights[1, :, :, src_len[1]:] == 0).all()


def test_fast_int8_quantises_the_rnn_encoder_too(src_vocab, tgt_vocab, padded_batch):
    """-int8 -fast: torch's dynamic int8 quantisation of the fast model's linear layers, its
    decoder's cells and its encoder's LSTM; -int8 alone quantises the linear layers only."""
    import warnings

    from torch.ao.nn.quantized.dynamic import LSTM as DynamicQuantizedLSTM
    opt = TINY_RNNS["brnn-LSTM-general"]
    model = for_inference(make_model(opt, src_vocab, tgt_vocab, 2), "cpu", int8=True, fast=True)
    assert isinstance(model.encoder.rnn, DynamicQuantizedLSTM)
    exact_int8 = for_inference(make_model(opt, src_vocab, tgt_vocab, 2), "cpu", int8=True)
    assert type(exact_int8.encoder.rnn) is torch.nn.LSTM  # -int8 alone keeps exact's encoder
    # the int8 encoder is the model's: its states within int8 rounding of fp32's, not equal
    src, src_len, _ = padded_batch
    with torch.no_grad():
        (memory, finals), (memory32, finals32) = (
            m.encode(src, src_len) for m in (model, make_model(opt, src_vocab, tgt_vocab, 2)))
    assert not torch.equal(memory, memory32)
    assert torch.allclose(memory, memory32, atol=1e-2)
    for state, state32 in zip(finals, finals32):  # h and c, (layers, B, H); the first layer's
        assert torch.allclose(state, state32, atol=5e-2)  # c strays most (0.02 here)
    # the last layer's final h: the forward direction's output at each line's last word (the
    # padding skipped), the backward direction's at its first
    half = memory.size(2) // 2
    for row, length in enumerate(src_len.tolist()):
        assert torch.equal(finals[0][-1, row], torch.cat(
            [memory[row, length - 1, :half], memory[row, 0, half:]]))
    # its translations are those of torch's quantize_dynamic of the fast model with these layers
    recipe = make_model(opt, src_vocab, tgt_vocab, 2)
    fast.to_fast(recipe.decoder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        recipe = torch.ao.quantization.quantize_dynamic(
            recipe, {torch.nn.Linear, torch.nn.LSTMCell, torch.nn.LSTM}, dtype=torch.qint8)
    lines, options = _lines(20, 5), DecodingOptions(beam_size=3, n_best=3)
    quick = Translator(model, src_vocab, tgt_vocab, options).translate(lines, batch_size=7)
    expected = Translator(recipe, src_vocab, tgt_vocab, options).translate(lines, batch_size=7)
    assert [t.preds for t in quick] == [t.preds for t in expected]
    assert [t.scores for t in quick] == [t.scores for t in expected]
    assert len({tuple(t.preds[0]) for t in quick}) > 5  # a model whose output varies
    exact = Translator(exact_int8, src_vocab, tgt_vocab, options).translate(lines, batch_size=7)
    assert [t.scores for t in exact] != [t.scores for t in quick]


@pytest.mark.parametrize("rows,keys", [(4, 3), (4, 12), (8, 30), (20, 12)])
def test_one_steps_self_attention_is_the_multi_headed_attention(rows, keys, src_vocab,
                                                                tgt_vocab):
    """One query row over few keys (elementwise), over more for a lone sentence's few rows
    (one fused call) and for many rows (products): MultiHeadedAttention's contexts."""
    layer = make_model(MARIAN_LIKE, src_vocab, tgt_vocab).decoder.layers[0]
    quick = fast.FastDecoderLayer(layer)
    gen = torch.Generator().manual_seed(rows * keys)
    q = torch.randn(rows, 4, 1, 4, generator=gen)
    k, v = (torch.randn(rows, 4, keys, 4, generator=gen) for _ in range(2))
    expected = layer.self_attn.attention(q, k, v, None)[0]
    assert torch.allclose(quick.self_attention(q, k, v, None), expected, atol=1e-6)
