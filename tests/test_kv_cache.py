"""The Transformer's self-attention cache under beam reorders: whatever mix of branching,
tiling, rows leaving and growth past the buffer's capacity, every row's next step equals
decoding its own token history from scratch."""
import random

import pytest
import torch

from onmt_lite.models import kv_cache
from onmt_lite.models.kv_cache import INITIAL_CAPACITY, KVCache
from onmt_lite.models.model import replica
from onmt_lite.search.loop import fill_gaps

ATOL = 1e-5


def from_scratch(model, src, src_len, sentence, history):
    """Outputs and attention of the last position of each row's history, decoded in one call."""
    memory, final = model.encode(src.index_select(0, sentence), src_len.index_select(0, sentence))
    model.decoder.init_state(src_len.index_select(0, sentence), memory, final)
    out, attn = model.decoder(history)
    return out[:, -1], attn[:, -1]


@pytest.mark.parametrize("whole", [True, False], ids=["copied whole", "rows that move"])
@pytest.mark.parametrize("seed", range(4))
def test_every_row_follows_its_own_history(transformer_model, padded_batch, tgt_vocab, seed,
                                           whole, monkeypatch):
    if not whole:
        monkeypatch.setattr(kv_cache, "WHOLE_COPY", 0)
    model, (src, src_len, tgt) = transformer_model, padded_batch
    reference = replica(model)  # same weights, a decoder of its own
    rng, k = random.Random(seed), 3
    with torch.no_grad():
        memory, final = model.encode(src, src_len)
        model.decoder.init_state(src_len, memory, final)
        history, sentence = tgt[:, :1], torch.arange(src.size(0))
        model.decoder.step(history[:, -1])
        model.decoder.map_state(lambda t, d: t.repeat_interleave(k, dim=d))
        history, sentence = history.repeat_interleave(k, 0), sentence.repeat_interleave(k)
        blocks = src.size(0)
        for step in range(INITIAL_CAPACITY + 6):  # grows past the first buffer
            tokens = torch.tensor([rng.randrange(4, len(tgt_vocab)) for _ in sentence])
            out, attn = model.decoder.step(tokens)
            history = torch.cat([history, tokens.view(-1, 1)], 1)
            ref_out, ref_attn = from_scratch(reference, src, src_len, sentence, history)
            torch.testing.assert_close(out, ref_out, atol=ATOL, rtol=0)
            torch.testing.assert_close(attn, ref_attn, atol=ATOL, rtol=0)
            # a beam step: each row continues a hypothesis of its own sentence, often one
            # that another row continues too; twice a sentence leaves
            # (the first, the others keeping their order, so that one stays in its buffer
            # rows but changes block; then one at random, in the batched search's order)
            gone = {5: 0, 11: rng.randrange(blocks)}.get(step)
            kept = [b for b in range(blocks) if b != gone]
            order = kept if step == 5 else fill_gaps(kept)
            index = torch.tensor([b * k + rng.choice([0, 0, 1, 2]) for b in order
                                  for _ in range(k)])
            blocks -= gone is not None
            model.decoder.map_state(lambda t, d: t.index_select(d, index))
            history, sentence = history.index_select(0, index), sentence.index_select(0, index)
            # the live sentences' memory rows, each shared by its k hypotheses
            assert model.decoder.state["memory_keys.0"].size(0) == blocks
            assert model.decoder.group == k


def test_fill_gaps_moves_only_sentences_past_the_end():
    assert fill_gaps([0, 1, 2]) == [0, 1, 2]
    assert fill_gaps([1, 2, 4]) == [4, 1, 2]
    assert fill_gaps([0, 3, 5, 6]) == [0, 5, 6, 3]
    assert fill_gaps([]) == []


def test_a_cache_read_whole_grows_and_tiles_into_zeroed_memory_and_stays_tight():
    """The compiled step reads every column: the buffer is zeroed memory, and its capacity
    keeps within INITIAL_CAPACITY columns of those in use, growing and shrinking."""
    cache = KVCache(2, 2, 1, 1, torch.float, "cpu", zeroed=True, tight=True)
    assert not cache.buffer.any()
    cache.reserve(1)
    cache.append(0, torch.ones(2, 1, 1, 1), torch.ones(2, 1, 1, 1))
    cache.advance(1)
    cache.reserve(40)  # grown: the prefix, then zeros
    cache.reorder(torch.tensor([0, 0, 1, 1]), group=2)  # more rows: a larger buffer
    assert cache.buffer.size(4) == 48 and cache.buffer.size(2) == 4
    assert cache.buffer[0, :, :, :, :1].eq(1).all() and not cache.buffer[..., 1:, :].any()
    cache.length = 40
    cache.reserve(1)
    assert cache.buffer.size(4) == 48  # 7 columns to spare
    cache.length = 9  # the furthest row went back (sentences left): shrunk, the prefix kept
    cache.reserve(1)
    assert cache.buffer.size(4) == 16 and cache.buffer[0, :, :, :, :1].eq(1).all()
    plain = KVCache(2, 2, 1, 1, torch.float, "cpu")
    plain.reserve(17)
    assert plain.buffer.size(4) == 32  # doubled: the plain step reads the columns in use
    zeroed = KVCache(2, 2, 1, 1, torch.float, "cpu", zeroed=True)  # -compile -int8
    zeroed.reserve(17)
    assert zeroed.buffer.size(4) == 32 and not zeroed.buffer.any()  # doubled, zeroed


def test_a_resize_leaves_the_rows_of_ended_sentences_behind():
    """A batch's last sentence running on to the length limit grows the buffer: it grows the
    rows in use only (zeroed memory is resident: the Argos package's batches of 12 with
    -compile -int8 peaked at 460 MiB, 357 without them), and keeps the spare rows a compiled
    step asked for."""
    for spare, rows in [(0, 2), (16, 16)]:  # (a compiled step's spare rows, rows kept)
        cache = KVCache(1, 12, 1, 1, torch.float, "cpu", zeroed=True)
        cache.spare_rows(spare)
        cache.reserve(1)
        cache.append(0, torch.arange(12.).view(12, 1, 1, 1), torch.zeros(12, 1, 1, 1))
        cache.advance(1)
        cache.reorder(torch.tensor([8, 9]), group=2)  # one sentence of six goes on: rows 8, 9
        cache.reserve(INITIAL_CAPACITY)
        assert cache.buffer.shape[2] == rows and cache.buffer.size(4) == 2 * INITIAL_CAPACITY
        keys, _ = cache.logical(0)
        assert keys[:, 0, 0, 0].tolist() == [8, 9] and not cache.buffer[:, :, 2:].any()


@pytest.mark.parametrize("whole", [True, False], ids=["copied whole", "rows that move"])
def test_rows_that_swap_histories(whole, monkeypatch):
    # row 0 takes row 1's history and row 1 row 0's: copied one by one in order, row 1 would
    # read row 0 after it was overwritten
    if not whole:
        monkeypatch.setattr(kv_cache, "WHOLE_COPY", 0)
    cache = KVCache(1, 2, 1, 1, torch.float, "cpu")
    cache.reserve(1)
    cache.append(0, torch.tensor([[[[1.0]]], [[[2.0]]]]), torch.tensor([[[[3.0]]], [[[4.0]]]]))
    cache.advance(1)
    cache.reorder(torch.tensor([1, 0]), group=1)
    keys, values = cache.logical(0)
    assert keys.flatten().tolist() == [2.0, 1.0] and values.flatten().tolist() == [4.0, 3.0]
    assert cache.slot.tolist() == [0, 1]  # each row in its own block: both copied
