"""bf16 products on CPU: each layer matches its fp32 original within bf16 rounding."""
import copy

import pytest
import torch
from torch import nn

from onmt_lite.models.bfloat16 import (
    Bfloat16GRUCell,
    Bfloat16Linear,
    Bfloat16LSTMCell,
    has_bf16_units,
    to_bfloat16,
)
from onmt_lite.models.inference import for_inference

TOLERANCE = 2e-2  # bf16 keeps 8 significant bits; these products sum 16-32 terms


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == torch.float32 and bool(
        ((a - b).abs() <= TOLERANCE * (1 + b.abs())).all())


@pytest.mark.parametrize("bias,rows", [(True, 5), (False, 5), (True, 32), (False, 1)])
def test_linear(bias, rows):  # row counts are padded to a multiple of 32 inside
    torch.manual_seed(0)
    linear = nn.Linear(24, 16, bias=bias)
    if bias:
        with torch.no_grad():
            linear.bias.mul_(10)  # a bias larger than the product: kept in fp32
    x = torch.randn(rows, 3, 24)
    out = Bfloat16Linear(linear)(x)
    assert out.shape == (rows, 3, 16) and close(out, linear(x))


@pytest.mark.parametrize("rows", [5, 32, 40, 300, 513])  # >256: in blocks
def test_packed_weights_give_the_plain_bf16_product(rows):
    """Weights kept in oneDNN's layout change nothing: the product is bf16 F.linear's."""
    torch.manual_seed(0)
    linear = nn.Linear(64, 48)
    layer = Bfloat16Linear(linear)
    x = torch.randn(rows, 64)
    plain = nn.functional.linear(x.bfloat16(), linear.weight.bfloat16()).float() + linear.bias
    assert torch.equal(layer(x), plain)
    if has_bf16_units():  # oneDNN packs bf16 weights only on CPUs that multiply them
        assert layer.weight.is_mkldnn


def test_lstm_cell_over_steps():
    torch.manual_seed(0)
    cell = nn.LSTMCell(12, 16)
    twin = Bfloat16LSTMCell(cell)
    h = c = torch.zeros(4, 16)
    h2, c2 = h, c
    for _ in range(5):
        x = torch.randn(4, 12)
        h, c = cell(x, (h, c))
        h2, c2 = twin(x, (h2, c2))
        assert close(h2, h) and close(c2, c)


def test_gru_cell_over_steps():
    torch.manual_seed(0)
    cell = nn.GRUCell(12, 16)
    twin = Bfloat16GRUCell(cell)
    h = h2 = torch.randn(4, 16)
    for _ in range(5):
        x = torch.randn(4, 12)
        h, h2 = cell(x, h), twin(x, h2)
        assert close(h2, h)


def test_model_matches_fp32(model_case, padded_batch):
    _, _, model = model_case
    src, src_len, tgt = padded_batch
    model.eval()
    low = for_inference(copy.deepcopy(model), "cpu", precision="bf16")
    assert not any(type(m) in (nn.Linear, nn.LSTMCell, nn.GRUCell) for m in low.modules())
    products = [m for m in low.modules() if isinstance(m, (Bfloat16Linear, Bfloat16LSTMCell))]
    assert products and all(m.weight.dtype == torch.bfloat16 for m in products)
    with torch.inference_mode():
        expected, expected_attn = model(src, src_len, tgt)
        got, attn = low(src, src_len, tgt)
    assert got.dtype == torch.float32
    assert (got - expected).abs().max() < 0.05 and (attn - expected_attn).abs().max() < 0.05


def test_shared_layer_converted_once():
    shared = nn.Linear(4, 4)
    outer = nn.Sequential(shared, nn.Sequential(shared))
    to_bfloat16(outer)
    assert outer[0] is outer[1][0] and isinstance(outer[0], Bfloat16Linear)


def test_fp16_on_cpu_and_int8_with_bf16_refused(transformer_model):
    with pytest.raises(ValueError, match="fp16 needs a GPU"):
        for_inference(transformer_model, "cpu", precision="fp16")
    with pytest.raises(ValueError, match="exclude each other"):
        for_inference(transformer_model, "cpu", int8=True, precision="bf16")


def test_warns_on_a_cpu_without_bf16_units(monkeypatch, caplog):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    to_bfloat16(nn.Linear(2, 2))
    assert "no bf16 units" in caplog.text


def test_mixed_keeps_the_output_layer_in_fp32(model_case, padded_batch):
    """-precision mixed: the encoder's and decoder's products in bf16, the generator's fp32."""
    _, _, model = model_case
    src, src_len, tgt = padded_batch
    model.eval()
    mixed = for_inference(copy.deepcopy(model), "cpu", precision="mixed")
    assert type(mixed.generator) is nn.Linear and mixed.generator.weight.dtype == torch.float32
    for part in (mixed.encoder, mixed.decoder):
        assert not any(type(m) in (nn.Linear, nn.LSTMCell, nn.GRUCell) for m in part.modules())
    with torch.inference_mode():
        expected, _ = model(src, src_len, tgt)
        got, _ = mixed(src, src_len, tgt)
    assert (got - expected).abs().max() < 0.05
    with pytest.raises(ValueError, match="mixed is for CPU"):
        for_inference(copy.deepcopy(model), "cuda", precision="mixed")


@pytest.mark.parametrize("units, options, picked", [
    (True, {"fast": True}, "mixed"),
    (False, {"fast": True}, "fp32"),  # bf16 products without bf16 units are slower
    (True, {}, "fp32"),  # exact decoding stays exact
    (True, {"fast": True, "int8": True}, "fp32"),
    (True, {"fast": True, "compile": True}, "mixed"),
    (True, {"compile": True}, "mixed"),
])
def test_auto_picks_mixed_for_the_fast_path_on_bf16_units(monkeypatch, units, options, picked):
    from onmt_lite.models import inference as model_module
    monkeypatch.setattr(model_module, "has_bf16_units", lambda: units)
    flags = dict({"fast": False, "int8": False, "compile": False}, **options)
    assert model_module.pick_precision("auto", "cpu", **flags) == picked
    assert model_module.pick_precision("fp32", "cpu", **flags) == "fp32"
    assert model_module.pick_precision("auto", "cuda:0", **dict(flags, int8=False)) == "fp32"
