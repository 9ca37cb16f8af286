"""The batched engine gives what one Beam per sentence gives, on random tiny models."""
import pytest
import torch
from conftest import TINY_MODELS, make_model

from onmt_lite.translate.translator import DecodingOptions, Translator
from onmt_lite.vocab import Vocab

SRC = ["a", "b", "c", "d", "e", "f"]
TGT = ["A", "B", "C", "D", "E", "F", "G"]
OPTIONS = [
    {}, {"n_best": 3}, {"length_penalty": "none"},
    {"length_penalty": "wu", "alpha": 0.6, "coverage_penalty": "wu", "beta": 0.2},
    {"coverage_penalty": "summary", "beta": 0.3, "stepwise_penalty": True},
    {"block_ngram_repeat": 2}, {"block_ngram_repeat": 1, "ignore_when_blocking": ["A"]},
    {"min_length": 4, "max_length": 7}, {"max_length_ratio": 0.0, "max_length": 5},
]


def _lines(seed: int, n: int = 23):
    gen = torch.Generator().manual_seed(seed)
    return [" ".join(SRC[int(i)] for i in torch.randint(0, len(SRC), (int(length),), generator=gen))
            for length in torch.randint(1, 9, (n,), generator=gen)]


@pytest.mark.parametrize("model_name", ["transformer", "brnn-LSTM-general", "rnn-GRU-mlp"])
@pytest.mark.parametrize("options", OPTIONS, ids=[str(o) for o in OPTIONS])
def test_engines_agree(model_name, options):
    src_vocab = Vocab(["<unk>", "<blank>", "<s>", "</s>"] + SRC)
    tgt_vocab = Vocab(["<unk>", "<blank>", "<s>", "</s>"] + TGT)
    model = make_model(TINY_MODELS[model_name], src_vocab, tgt_vocab, seed=3)
    lines = _lines(seed=len(str(options)))
    results = {}
    for engine in ("sentence", "batch"):
        translator = Translator(model, src_vocab, tgt_vocab,
                                DecodingOptions(beam_size=4, beam_engine=engine, **options))
        results[engine] = translator.translate(lines, batch_size=8)
    for ours, theirs in zip(results["batch"], results["sentence"]):
        assert ours.preds == theirs.preds
        assert ours.scores == pytest.approx(theirs.scores, abs=1e-5)
        for a, b in zip(ours.attns, theirs.attns):
            assert torch.allclose(a, b, atol=1e-6)
