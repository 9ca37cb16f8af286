"""The batched engine gives what one Beam per sentence gives, on random tiny models; OpenNMT-py's
finishing rule at the step a batch-mate leaves, on a hand-built table."""
import math

import pytest
import torch
from conftest import TINY_MODELS, make_model

from onmt_lite.search import candidates
from onmt_lite.search.candidates import exact_top, top_candidates
from onmt_lite.search.finishing import OnmtSlots
from onmt_lite.search.global_scorer import GNMTGlobalScorer
from onmt_lite.translate import DecodingOptions, Translator
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


@pytest.mark.parametrize("n, rows, k, vocab", [(3, 5, 10, 40), (2, 4, 8, 64), (4, 3, 6, 11),
                                              (1, 2, 4, 16), (1, 4, 8, 8000), (16, 4, 8, 8000)])
def test_the_exact_top_is_topk_itself(n, rows, k, vocab, monkeypatch):
    """exact_top gives topk's very values and indices: on scores all different (ranked by
    groups, at any size here), and with equal scores, finished rows, -inf rows or NaN (ranked
    by topk)."""
    monkeypatch.setattr(candidates, "EXACT_TOPK_BELOW", 0)
    gen = torch.Generator().manual_seed(n * 100 + vocab)
    for trial in range(40):
        curr = torch.randn(n, rows, vocab, generator=gen)
        if trial % 5 == 1:
            curr[:, 1:] = -65504.0
        if trial % 5 == 2:
            curr = (curr * 2).round()  # ties everywhere
        if trial % 5 == 3:
            curr[:, 1:] = float("-inf")
        if trial % 5 == 4 and trial % 2:
            curr[0, 0, 0] = float("nan")
        expected = curr.view(n, rows * vocab).topk(k, dim=1)
        values, ids = exact_top(curr, k)
        assert torch.equal(values, expected.values) or torch.equal(values.isnan(),
                                                                   expected.values.isnan())
        assert torch.equal(ids, expected.indices)


def test_the_exact_top_ranks_by_groups_where_nothing_is_equal(monkeypatch):
    """Scores all different take the grouped ranking (no topk over all of rows * V)."""
    curr = torch.randn(4, 4, 8000, generator=torch.Generator().manual_seed(1))
    expected = curr.view(4, -1).topk(8, dim=1)
    widths = []
    original = torch.Tensor.topk

    def topk(self, k, *args, **kwargs):
        widths.append(self.size(-1))
        return original(self, k, *args, **kwargs)
    monkeypatch.setattr(torch.Tensor, "topk", topk)
    values, ids = exact_top(curr, 8)
    assert torch.equal(values, expected.values) and torch.equal(ids, expected.indices)
    assert max(widths) < 4 * 8000


def test_top_candidates_hand_case():
    # 2 rows x 16 tokens in groups of 2 (tokens v and v + 8): the best three of all 32 are
    # row 1 token 3 (0.9), row 0 token 12 (0.8) and row 1 token 11 (0.7).
    curr = torch.zeros(1, 2, 16)
    curr[0, 1, 3], curr[0, 0, 12], curr[0, 1, 11], curr[0, 0, 4] = 0.9, 0.8, 0.7, 0.6
    values, ids = top_candidates(curr, 3, group=2)
    assert values[0].tolist() == pytest.approx([0.9, 0.8, 0.7])
    assert ids.tolist() == [[16 + 3, 12, 16 + 11]]


def test_a_sentence_finishes_from_its_own_rows_while_a_batch_mate_leaves():
    """OpenNMT-py's rule at the step where one sentence is done and leaves the batch while a
    hypothesis of the next one ends: the -65504 mask goes on that hypothesis' own row before the
    batch shrinks, and the sentence finishes later exactly as it would alone.

    Beam 2, n_best 2, no length penalty, </s> = 3; ``path`` names a candidate by its flat
    index (sentence * 2 + slot)."""
    def path(c):
        return torch.tensor([c]), torch.zeros(1, 1)

    def run(steps):
        """Feeds the (values, tokens) of each step to one rule; returns the n-best by
        sentence and the running scores (as probabilities, flat) after each step."""
        n = steps[0][0].size(0)
        rule = OnmtSlots(GNMTGlobalScorer(), eos=3, max_length=10, n_best=2)
        rule.start(n, 2, torch.zeros(n * 2, 1, dtype=torch.bool))
        live, results, scores = list(range(n)), {}, []
        for step, (values, tokens) in enumerate(steps, start=1):
            values, tokens = values[live], tokens[live]
            rule.rank(torch.zeros(len(live) * 2, 5), step, torch.zeros(len(live) * 2, 1))
            rows = torch.arange(len(live) * 2).view(-1, 2)
            _, done = rule.advance(values.log(), rows, tokens, step,
                                   torch.zeros(len(live) * 2, 1), path)
            scores.append(rule.scores.exp().view(-1).tolist())
            for i, nbest in done.items():
                results[live[i]] = [(h.tokens, round(math.exp(h.score), 6)) for h in nbest]
            keep = [i for i in range(len(live)) if i not in done]
            if not keep:
                break
            if len(keep) < len(live):
                rule.keep(torch.tensor(keep), torch.tensor([2 * i + j for i in keep
                                                            for j in range(2)]))
                live = [live[i] for i in keep]
        return results, scores

    # step 1: sentence 0 takes .6, .4; sentence 1 .7, .3 (no </s>)
    # step 2: sentence 0: .30 and .25 both end in </s>: its top ended, 2 finished: done.
    #         sentence 1: .35 runs on; .21 ends in </s> (candidate 2 * 1 + 1 = 3), not on top:
    #         recorded, its row masked to -65504 (exp: 0) before sentence 0 leaves.
    # step 3: sentence 1 (now alone) takes .175 with </s> on top (candidate 0), .105 runs on:
    #         2 finished, done: .21 (candidate 3 of step 2) before .175. (Step 3's table has
    #         one row a sentence; sentence 0's is never read.)
    both = [(torch.tensor([[.6, .4], [.7, .3]]), torch.tensor([[4, 5], [4, 5]])),
            (torch.tensor([[.30, .25], [.35, .21]]), torch.tensor([[3, 3], [4, 3]])),
            (torch.tensor([[.175, .105]]).expand(2, 2), torch.tensor([[3, 4]]).expand(2, 2))]
    results, scores = run(both)
    assert results == {0: [([0], 0.3), ([1], 0.25)], 1: [([3], 0.21), ([0], 0.175)]}
    assert scores[1] == pytest.approx([0.0, 0.0, 0.35, 0.0])  # every end masked at step 2
    assert scores[2] == pytest.approx([0.0, 0.105])  # sentence 1 alone: its </s> masked
    # sentence 1 alone: the same n-best (candidate numbers count from its own first row)
    alone, _ = run([(v[1:], t[1:]) for v, t in both])
    assert alone == {0: [([1], 0.21), ([0], 0.175)]}
