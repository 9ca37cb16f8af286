"""-int8_engine: the int8 products packed for the engine named (fbgemm or oneDNN), the same
quantisation either way, and torch's own engine setting left as it was."""
import pytest
import torch
from conftest import SRC_WORDS, TINY_RNNS, TINY_TRANSFORMER, make_model
from torch import nn

from onmt_lite.errors import OptionError
from onmt_lite.models import int8
from onmt_lite.models.inference import for_inference
from onmt_lite.translate import DecodingOptions, Translator

ENGINES = [e for e in ("fbgemm", "onednn") if e in torch.backends.quantized.supported_engines]


def _product(linear, engine: str, x: torch.Tensor) -> torch.Tensor:
    """The int8 product of ``linear`` (a DynamicQuantizedLinear), its weights packed again by
    ``engine``."""
    before = torch.backends.quantized.engine
    torch.backends.quantized.engine = engine
    try:
        packed = torch.ops.quantized.linear_prepack(*linear._packed_params._weight_bias())
    finally:
        torch.backends.quantized.engine = before
    return torch.ops.quantized.linear_dynamic(x, packed, True)


@pytest.mark.skipif(len(ENGINES) < 2, reason="this torch build lacks fbgemm or oneDNN")
@pytest.mark.parametrize("engine", ENGINES)
def test_layers_are_packed_for_the_engine_named(engine):
    torch.manual_seed(0)
    x = torch.randn(200, 512)
    before = torch.backends.quantized.engine
    linear = int8.quantize(nn.Sequential(nn.Linear(512, 512)), {nn.Linear}, engine)[0]
    assert torch.backends.quantized.engine == before  # torch's own setting put back
    other = next(e for e in ENGINES if e != engine)
    assert not torch.equal(_product(linear, engine, x), _product(linear, other, x))
    assert torch.equal(linear(x), _product(linear, engine, x))


@pytest.mark.skipif(len(ENGINES) < 2, reason="this torch build lacks fbgemm or oneDNN")
@pytest.mark.parametrize("opt", [TINY_TRANSFORMER, TINY_RNNS["brnn-LSTM-general"]],
                         ids=["transformer", "lstm"])
def test_both_engines_translate_alike(opt, src_vocab, tgt_vocab):
    """The same quantisation by other kernels: the same hypotheses, scores within rounding."""
    gen = torch.Generator().manual_seed(4)
    lines = [" ".join(SRC_WORDS[int(i)] for i in torch.randint(0, 6, (int(n),), generator=gen))
             for n in torch.randint(1, 10, (24,), generator=gen)]
    results = []
    for engine in ENGINES:
        model = for_inference(make_model(opt, src_vocab, tgt_vocab, 3), "cpu", int8=True,
                              fast=True, int8_engine=engine)
        translator = Translator(model, src_vocab, tgt_vocab, DecodingOptions(beam_size=4))
        results.append(translator.translate(lines, batch_size=8))
    for a, b in zip(*results):
        assert a.preds == b.preds
        assert a.scores == pytest.approx(b.scores, abs=1e-3)


def test_an_engine_this_torch_lacks_is_refused(monkeypatch):
    monkeypatch.setattr(int8, "supported_engines", lambda: ["qnnpack", "none"])
    with pytest.raises(OptionError, match="-int8_engine onednn: this torch build has no such "
                                          r"engine \(it has qnnpack\)"):
        int8.pick_engine("onednn")
    assert int8.pick_engine("auto") == torch.backends.quantized.engine


def test_an_engine_without_int8_is_refused(src_vocab, tgt_vocab):
    with pytest.raises(OptionError, match="-int8_engine onednn names the kernels of -int8: "
                                          "add -int8"):
        for_inference(make_model(TINY_TRANSFORMER, src_vocab, tgt_vocab, 3), "cpu",
                      int8_engine="onednn")
