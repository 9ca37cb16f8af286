"""Models stored in int8 (CTranslate2 models, Argos packages): by default they decode on the fast
path with their own int8 weights, given back exactly by a quantisation with one scale per output
row; -precision fp32 decodes their dequantized weights exactly."""
import logging
import os

import pytest
import torch
from conftest import ROOT

from onmt_lite.checkpoint import load_checkpoint
from onmt_lite.models.fast import FastDecoderLayer
from onmt_lite.models.int8 import Int8Linear, quantize_rows
from onmt_lite.translate import build_translator

TINY = os.path.join(ROOT, "tests", "reference", "ct2_tiny")
LINES = ["▁a ▁b ▁c", "▁d ▁e", "▁a"]


def _int8(module) -> torch.Tensor:
    return module.weight().int_repr()


@pytest.mark.parametrize("name", ["prenorm_int8", "marian_int8"])
def test_the_stored_int8_weights_come_back_exactly(name):
    """Every linear layer's int8 values are those stored, the fast path's fused products
    included (the self-attention's queries, keys and values side by side, the query rows
    scaled by 1/sqrt(d): a power of two here)."""
    path = os.path.join(TINY, name)
    stored = load_checkpoint(path).int8_weights
    model = build_translator({"model": path}).model
    modules = dict(model.named_modules())
    linears = [n for n in stored if not n.endswith("embeddings.weight")]
    assert linears
    for weight_name in linears:
        assert torch.equal(_int8(modules[weight_name[:-len(".weight")]]),
                           stored[weight_name][0]), weight_name
    for i, layer in enumerate(model.decoder.layers):
        assert isinstance(layer, FastDecoderLayer)
        parts = [stored[f"decoder.layers.{i}.self_attn.linear_{p}.weight"][0]
                 for p in ("query", "keys", "values")]
        assert torch.equal(_int8(layer.qkv), torch.cat(parts))
        assert torch.equal(_int8(layer.context_query),
                           stored[f"decoder.layers.{i}.context_attn.linear_query.weight"][0])


def test_rows_quantised_with_their_largest_weight_at_127():
    linear = torch.nn.Linear(4, 3)
    with torch.no_grad():
        linear.weight.copy_(torch.tensor([[0.5, -1.0, 0.25, 0.0], [2.0, 1.0, -0.5, 0.0],
                                          [0.0, 0.0, 0.0, 0.0]]))
    holder = torch.nn.Sequential(linear)
    quantize_rows(holder)
    assert _int8(holder[0]).tolist() == [[64, -127, 32, 0], [127, 64, -32, 0], [0, 0, 0, 0]]
    x = torch.randn(2, 4)
    assert torch.allclose(holder[0](x), linear(x), atol=0.05)


def test_a_model_stored_in_int8_decodes_on_the_int8_fast_path_unless_told(caplog):
    path = os.path.join(TINY, "prenorm_int8")
    with caplog.at_level(logging.INFO, logger="onmt_lite"):
        default = build_translator({"model": path, "search": "ctranslate2"})
    assert any("is stored in int8: it decodes on the fast path with its own int8 weights"
               in r.getMessage() for r in caplog.records)
    caplog.clear()
    exact = build_translator({"model": path, "search": "ctranslate2", "precision": "fp32"})
    assert not any("stored in int8" in r.getMessage() for r in caplog.records)
    assert type(exact.model.decoder.layers[0]).__name__ == "DecoderLayer"
    assert type(exact.model.generator) is torch.nn.Linear
    assert type(default.model.generator) is Int8Linear  # torch's dynamic int8 one
    # both translate every line; the scores differ by int8 rounding only
    for fast, plain in zip(default.translate(LINES), exact.translate(LINES)):
        assert len(fast.preds) == len(plain.preds)
        assert fast.scores[0] == pytest.approx(plain.scores[0], abs=0.5)


def test_an_fp32_model_keeps_exact_decoding_by_default():
    model = build_translator({"model": os.path.join(TINY, "prenorm_float32")}).model
    assert type(model.decoder.layers[0]).__name__ == "DecoderLayer"
    assert type(model.generator) is torch.nn.Linear
