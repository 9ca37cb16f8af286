"""The batched engine gives what one Beam per sentence gives, on random tiny models."""
import pytest
import torch
from conftest import TINY_MODELS, make_model

from onmt_lite.search.candidates import top_candidates
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


@pytest.mark.parametrize("n, k, vocab", [(3, 5, 40), (2, 4, 64), (4, 3, 11), (1, 2, 16)])
def test_top_candidates_are_the_flat_topk(n, k, vocab):
    gen = torch.Generator().manual_seed(n * 100 + vocab)
    for trial in range(30):
        curr = torch.randn(n, k, vocab, generator=gen)
        if trial % 3 == 1:  # rows of finished hypotheses and equal values
            curr[:, 1:] = -65504.0
        if trial % 3 == 2:
            curr = curr.round()
        values, ids = top_candidates(curr, k)
        expected = curr.view(n, k * vocab).topk(k, dim=1).values
        assert torch.equal(values, expected)
        assert torch.equal(curr.view(n, k * vocab).gather(1, ids), values)
        assert all(len(set(row)) == k for row in ids.tolist())  # k distinct candidates


def test_top_candidates_hand_case():
    # 2 rows x 16 tokens in groups of 2 (tokens v and v + 8): the best three of all 32 are
    # row 1 token 3 (0.9), row 0 token 12 (0.8) and row 1 token 11 (0.7).
    curr = torch.zeros(1, 2, 16)
    curr[0, 1, 3], curr[0, 0, 12], curr[0, 1, 11], curr[0, 0, 4] = 0.9, 0.8, 0.7, 0.6
    values, ids = top_candidates(curr, 3, group=2)
    assert values[0].tolist() == pytest.approx([0.9, 0.8, 0.7])
    assert ids.tolist() == [[16 + 3, 12, 16 + 11]]
