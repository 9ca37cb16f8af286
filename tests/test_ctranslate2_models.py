"""CTranslate2 model directories read without ctranslate2 (ct2_format.py, ct2_model.py): with
``-search ctranslate2`` and the same options they give CTranslate2's own translations and
scores, line for line.

The references are CTranslate2 4.8.5's outputs, made in a side environment by
tests/reference/make_ctranslate2_models.py: tests/reference/ct2_tiny/ holds small models made
by its converter and serializer (float32, float16 and int8; post-norm Marian and pre-norm), and
tests/reference/ctranslate2_models.json their translations. The conversions of the OpenNMT-py
fixtures are too large to keep: ``--fixtures DIR`` makes them, and the tests of
tests/reference/ctranslate2_fixtures.json run where ONMT_LITE_CT2_FIXTURES names DIR.
"""
import json
import os
import shutil
import struct

import pytest
import torch
from conftest import ROOT
from test_search_ctranslate2 import assert_same

from onmt_lite.checkpoint import CheckpointError, load_checkpoint
from onmt_lite.ct2_format import read_model_bin
from onmt_lite.ct2_model import ct2_sinusoids
from onmt_lite.translate import build_translator

REFERENCE = os.path.join(ROOT, "tests", "reference")
TINY = os.path.join(REFERENCE, "ct2_tiny")
with open(os.path.join(REFERENCE, "ctranslate2_models.json"), encoding="utf-8") as f:
    REF = json.load(f)
with open(os.path.join(REFERENCE, "ctranslate2_fixtures.json"), encoding="utf-8") as f:
    FIXTURES_REF = json.load(f)
FIXTURES = os.environ.get("ONMT_LITE_CT2_FIXTURES", "")
needs_fixtures = pytest.mark.skipif(
    not os.path.isdir(os.path.join(FIXTURES, "spm")),
    reason="ONMT_LITE_CT2_FIXTURES names no folder of the fixtures' CTranslate2 conversions "
           "(make them: ~/onmt-peers/bin/python tests/reference/make_ctranslate2_models.py "
           "--fixtures DIR)")
# translate_batch argument -> onmt_lite option
OPTIONS = dict(beam_size="beam_size", num_hypotheses="n_best", length_penalty="alpha",
               min_decoding_length="min_length", max_decoding_length="max_length",
               replace_unknowns="replace_unk")


def translate(model: str, lines, options: dict, batch_size: int = 32):
    """Exact decoding (-precision fp32: a model stored in int8 decodes its dequantized weights,
    as CTranslate2 does with compute_type float32)."""
    translator = build_translator({"model": model, "search": "ctranslate2", "precision": "fp32",
                                   **{OPTIONS[k]: v for k, v in options.items()}})
    return translator.translate(lines, batch_size=batch_size)


CASES = [(model, case) for model in REF["models"] for case in REF["models"][model]["cases"]]


@pytest.mark.parametrize("model,case", CASES, ids=[f"{m}: {c}" for m, c in CASES])
def test_tiny_models_translate_as_ctranslate2(model, case):
    """float16 weights read as float32, int8 ones dequantized: CTranslate2 computing in
    float32 (compute_type float32) does the same, so the outputs are its own."""
    ref = REF["models"][model]
    results = translate(os.path.join(TINY, model), ref["lines"], ref["cases"][case]["options"])
    assert_same(results, ref["cases"][case]["hypotheses"])


def test_int8_weights_are_kept_and_dequantized_per_row():
    ckpt = load_checkpoint(os.path.join(TINY, "marian_int8"))
    stored = read_model_bin(os.path.join(TINY, "marian_int8", "model.bin"))
    weight = stored.variables["encoder/layer_0/self_attention/linear_0/weight"]
    scale = stored.variables["encoder/layer_0/self_attention/linear_0/weight_scale"]
    assert weight.dtype == torch.int8 and scale.shape == (weight.size(0),)
    keys, key_scale = ckpt.int8_weights["encoder.layers.0.self_attn.linear_keys.weight"]
    rows = weight.size(0) // 3  # query, keys, values fused: the keys are the second third
    assert torch.equal(keys, weight[rows:2 * rows]) and torch.equal(key_scale, scale[rows:2 * rows])
    assert torch.equal(ckpt.model_state["encoder.layers.0.self_attn.linear_keys.weight"],
                       keys.float() / key_scale.unsqueeze(1))
    # the output layer keeps its int8 rows too, and a zero row (scale 1) for the added start row
    output, output_scale = ckpt.int8_weights["generator.weight"]
    assert output.size(0) == len(ckpt.tgt_vocab) and output_scale[-1] == 1.0
    assert not output[-1].any()


def test_added_rows_never_win_and_the_decoder_starts_from_zero():
    """A Marian conversion has no <pad> and starts the decoder from a zero embedding: one row
    is added for both, with bias -1e9 (nothing in the softmax) and banned."""
    ckpt = load_checkpoint(os.path.join(TINY, "marian_float32"))
    start = ckpt.tgt_vocab.bos
    assert start == ckpt.tgt_vocab.pad == len(ckpt.tgt_vocab) - 1
    assert ckpt.tokenizer["absent"] == [start]
    assert not ckpt.model_state["decoder.embeddings.embeddings.weight"][start].any()
    assert ckpt.generator_state["bias"][start] == -1e9


def test_generated_position_table_is_ctranslate2s():
    """No stored table: CTranslate2's sinusoids, sines then cosines, positions from 1."""
    ckpt = load_checkpoint(os.path.join(TINY, "prenorm_float32"))
    table = ckpt.position_tables["encoder"]
    assert torch.allclose(table[0, :8], torch.sin(torch.ones(8) * torch.exp(
        -torch.arange(8.0) * torch.log(torch.tensor(10000.0)) / 7)), atol=1e-7)
    assert torch.equal(table, ct2_sinusoids(table.size(0), 16))


# -- model.bin versions and refusals ----------------------------------------------------------
def _string(text: str) -> bytes:
    data = text.encode("utf-8")
    return struct.pack("<H", len(data) + 1) + data + b"\0"


def write_model_bin(path: str, variables: dict, aliases: dict, version: int = 6,
                    spec: str = "TransformerSpec", revision: int = 7) -> None:
    """A model.bin in ModelSpec._serialize's layout; versions 3 and below write item sizes
    and counts instead of type ids and byte counts (float32, int16 and int8 only)."""
    type_ids = {torch.float32: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3,
                torch.float16: 4, torch.bfloat16: 5}
    out = [struct.pack("<I", version)]
    if version >= 2:
        out += [_string(spec), struct.pack("<I", revision)]
    out.append(struct.pack("<I", len(variables)))
    for name, tensor in variables.items():
        out += [_string(name), struct.pack("<B", tensor.dim())]
        out += [struct.pack("<I", d) for d in tensor.shape]
        data = tensor.contiguous().view(torch.uint8).numpy().tobytes() if tensor.dim() else \
            tensor.reshape(1).view(torch.uint8).numpy().tobytes()
        if version >= 4:
            out += [struct.pack("<B", type_ids[tensor.dtype]), struct.pack("<I", len(data))]
        else:
            out += [struct.pack("<B", tensor.element_size()),
                    struct.pack("<I", tensor.numel())]
        out.append(data)
    if version >= 3:
        out.append(struct.pack("<I", len(aliases)))
        for alias, target in aliases.items():
            out += [_string(alias), _string(target)]
    with open(path, "wb") as f:
        f.write(b"".join(out))


def _copy(tmp_path, name="prenorm_float32") -> str:
    folder = str(tmp_path / name)
    shutil.copytree(os.path.join(TINY, name), folder)
    return folder


def _rewrite(folder: str, change=None, **kwargs) -> None:
    stored = read_model_bin(os.path.join(folder, "model.bin"))
    variables, aliases = dict(stored.variables), dict(stored.aliases)
    if change:
        change(variables, aliases)
    aliases = {a: t for a, t in aliases.items() if not a.endswith("_scale")}
    write_model_bin(os.path.join(folder, "model.bin"), variables, aliases, **kwargs)


def test_the_version_3_layout_reads_the_same(tmp_path):
    """Versions before 4 store item sizes and element counts instead of type ids."""
    folder = _copy(tmp_path, "prenorm_int8")
    _rewrite(folder, version=3)
    ref = REF["models"]["prenorm_int8"]
    case = ref["cases"]["beam 4, 2 hypotheses"]
    assert_same(translate(folder, ref["lines"], case["options"]), case["hypotheses"])


def test_a_version_1_model_without_aliases_reads_the_same(tmp_path):
    """Version 1: no spec name (a TransformerBase, 8 heads unless stored), no aliases; its
    revision 1 names are OpenNMT-tf's."""
    folder = _copy(tmp_path)

    def unalias(variables, aliases):
        for alias, target in aliases.items():
            variables[alias] = variables[target]
    _rewrite(folder, unalias, version=1)
    ref = REF["models"]["prenorm_float32"]
    case = ref["cases"]["greedy"]
    assert_same(translate(folder, ref["lines"], case["options"]), case["hypotheses"])


def test_an_unknown_version_is_refused_naming_the_file(tmp_path):
    folder = _copy(tmp_path)
    path = os.path.join(folder, "model.bin")
    with open(path, "r+b") as f:
        f.write(struct.pack("<I", 7))
    with pytest.raises(CheckpointError, match=rf"{path}: unknown CTranslate2 model.bin version 7 "
                                              r"\(this reader knows versions 1 to 6\)"):
        load_checkpoint(folder)


def test_a_truncated_file_is_refused_naming_the_file(tmp_path):
    folder = _copy(tmp_path)
    path = os.path.join(folder, "model.bin")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    with pytest.raises(CheckpointError, match=rf"{path}: truncated"):
        load_checkpoint(folder)


@pytest.mark.parametrize("name,value,feature", [
    ("encoder/layer_0/self_attention/relative_position_keys", torch.zeros(3, 8),
     "relative position representations"),
    ("decoder/layer_0/self_attention/rotary_dim", torch.tensor(0, dtype=torch.int32),
     "rotary position embeddings"),
    ("decoder/alibi", torch.tensor(1, dtype=torch.int8), "ALiBi"),
    ("decoder/layer_0/self_attention/num_heads_kv", torch.tensor(1, dtype=torch.int32),
     "multi-query"),
    ("decoder/layer_0/ffn/linear_0_noact/weight", torch.zeros(32, 16), "gated feed-forward"),
])
def test_features_onmt_lite_lacks_are_refused_by_name(tmp_path, name, value, feature):
    folder = _copy(tmp_path)
    _rewrite(folder, lambda variables, aliases: variables.update({name: value}))
    with pytest.raises(CheckpointError, match=rf"model.bin: uses [^(]*{feature}.*\({name}\)"):
        load_checkpoint(folder)


def test_multi_query_in_config_and_other_specs_are_refused(tmp_path):
    folder = _copy(tmp_path)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"multi_query_attention": True}, f)
    with pytest.raises(CheckpointError, match="uses multi-query attention"):
        load_checkpoint(folder)
    folder = _copy(tmp_path, "prenorm_int8")
    _rewrite(folder, spec="WhisperSpec")
    with pytest.raises(CheckpointError, match="spec 'WhisperSpec' is not a Transformer "
                                              "encoder-decoder"):
        load_checkpoint(folder)


def test_an_unused_variable_is_named(tmp_path):
    folder = _copy(tmp_path)
    _rewrite(folder, lambda variables, aliases: variables.update(
        {"decoder/something_new": torch.zeros(2)}))
    with pytest.raises(CheckpointError, match="does not use: decoder/something_new"):
        load_checkpoint(folder)


def test_a_missing_vocabulary_is_named(tmp_path):
    folder = _copy(tmp_path)
    os.remove(os.path.join(folder, "shared_vocabulary.json"))
    with pytest.raises(CheckpointError, match=r"shared_vocabulary.json: missing \(nor "):
        load_checkpoint(folder)


# -- the OpenNMT-py fixtures' conversions (ONMT_LITE_CT2_FIXTURES) ----------------------------
FIXTURE_CASES = [(m, c) for m in ("transformer", "spm")
                 for c in FIXTURES_REF["models"][m]["cases"]]


@needs_fixtures
@pytest.mark.parametrize("model,case", FIXTURE_CASES, ids=[f"{m}: {c}" for m, c in FIXTURE_CASES])
def test_fixture_conversions_translate_as_ctranslate2(model, case):
    ref = FIXTURES_REF["models"][model]
    results = translate(os.path.join(FIXTURES, model), ref["lines"], ref["cases"][case]["options"])
    assert_same(results, ref["cases"][case]["hypotheses"])


@needs_fixtures
def test_int8_fixture_dequantized_is_ctranslate2_in_float32():
    ref = FIXTURES_REF["models"]["spm_int8"]
    lines = ref["lines"][:200]
    case = ref["cases"]["argos"]
    assert_same(translate(os.path.join(FIXTURES, "spm_int8"), lines, case["options"]),
                case["hypotheses"][:200])


def test_convert_refuses_a_ctranslate2_model(tmp_path, capsys):
    """Its position tables and added rows have no place in a native file: it is read as is."""
    from onmt_lite.cli.convert import main
    assert main(["-model", os.path.join(TINY, "prenorm_float32"),
                 "-output", str(tmp_path / "out.pt")]) == 1
    assert "convert does not write it as one file" in capsys.readouterr().err
    assert not (tmp_path / "out.pt").exists()
