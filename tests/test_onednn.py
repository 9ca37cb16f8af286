"""Products through oneDNN: fp32 ones match torch's within rounding at every row count (padded
to a few shapes), and the fast path takes them where MKL's are slow and finds exact decoding's
hypotheses on tiny models."""
import pytest
import torch
from conftest import SRC_WORDS, TINY_RNNS, TINY_TRANSFORMER, make_model
from torch import nn

from onmt_lite.models import fast, onednn
from onmt_lite.models.inference import for_inference
from onmt_lite.models.onednn import OneDNNLinear, padded_rows, to_onednn
from onmt_lite.translate import DecodingOptions, Translator


@pytest.mark.parametrize("vendor, capability, slow", [
    ("AuthenticAMD", "AVX512", True), ("AuthenticAMD", "AVX2", False),
    ("GenuineIntel", "AVX512", False), ("", "AVX512", False)])
def test_onednn_takes_the_products_only_on_a_cpu_whose_avx512_mkl_leaves_unused(
        monkeypatch, vendor, capability, slow):
    # AMD with AVX2 only (Zen 3): oneDNN's small products take 1.2-10x MKL's time (onednn.py)
    monkeypatch.setattr(onednn, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: True)
    assert onednn.mkl_is_slow.__wrapped__() is slow


def test_rows_are_padded_to_a_few_shapes():
    assert [padded_rows(r) for r in (1, 2, 3, 5, 8, 9, 31, 32, 33, 64, 65, 256)] == \
        [1, 2, 4, 8, 8, 16, 32, 32, 64, 64, 96, 256]
    assert len({padded_rows(r) for r in range(1, onednn.MAX_ROWS + 1)}) == 13


@pytest.mark.parametrize("rows", [1, 3, 8, 33, 256, 300, 600])  # > MAX_ROWS: in blocks
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("relu", [False, True])
def test_an_fp32_product_is_torchs_within_rounding(rows, bias, relu):
    torch.manual_seed(rows)
    linear = nn.Linear(40, 24, bias=bias)
    x = torch.randn(rows, 2, 40)
    expected = linear(x)
    out = OneDNNLinear(linear)(x, relu=relu)
    assert out.shape == (rows, 2, 24) and out.dtype == torch.float32
    torch.testing.assert_close(out, torch.relu(expected) if relu else expected,
                               rtol=1e-5, atol=1e-5)


def test_shared_layers_stay_shared_and_other_layers_stay_as_they_are():
    shared = nn.Linear(8, 8)
    model = nn.Sequential(shared, nn.ReLU(), shared, nn.Linear(8, 4).to(torch.bfloat16),
                          nn.Embedding(5, 8))
    to_onednn(model)
    assert type(model[0]) is OneDNNLinear and model[0] is model[2]
    assert type(model[3]) is nn.Linear and type(model[4]) is nn.Embedding


def _lines(count: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    return [" ".join(SRC_WORDS[int(i)] for i in torch.randint(0, 6, (int(n),), generator=gen))
            for n in torch.randint(1, 12, (count,), generator=gen)]


@pytest.mark.parametrize("opt", [TINY_TRANSFORMER, *TINY_RNNS.values()],
                         ids=["transformer", *TINY_RNNS])
def test_the_fast_path_takes_onednn_products_where_mkl_is_slow(opt, src_vocab, tgt_vocab,
                                                               monkeypatch):
    lines = _lines(30, 2)
    options = DecodingOptions(beam_size=4, n_best=2)
    exact = Translator(for_inference(make_model(opt, src_vocab, tgt_vocab, 3), "cpu"),
                       src_vocab, tgt_vocab, options).translate(lines, batch_size=7)
    monkeypatch.setattr("onmt_lite.models.inference.mkl_is_slow", lambda: True)
    model = for_inference(make_model(opt, src_vocab, tgt_vocab, 3), "cpu", fast=True,
                          precision="fp32")
    products = [m for m in model.modules() if isinstance(m, OneDNNLinear)]
    assert products and not any(type(m) is nn.Linear for m in model.modules())
    assert model.generator in products
    if "heads" in opt:
        assert isinstance(model.decoder.layers[0].qkv, OneDNNLinear)
        assert isinstance(model.decoder.layers[0], fast.FastDecoderLayer)
    quick = Translator(model, src_vocab, tgt_vocab, options).translate(lines, batch_size=7)
    for a, b in zip(exact, quick):
        assert a.preds == b.preds
        assert a.scores == pytest.approx(b.scores, abs=1e-4)


def test_exact_decoding_keeps_torchs_products(src_vocab, tgt_vocab, monkeypatch):
    monkeypatch.setattr("onmt_lite.models.inference.mkl_is_slow", lambda: True)
    model = for_inference(make_model(TINY_TRANSFORMER, src_vocab, tgt_vocab, 3), "cpu")
    assert not any(isinstance(m, OneDNNLinear) for m in model.modules())
