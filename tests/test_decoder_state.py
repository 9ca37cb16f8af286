"""Decoder state: map_state reorders every entry along its batch dim; incremental decoding
matches a full-prefix call; padded source positions get no attention.

Every test runs on the Transformer and on each RNN variant (brnn LSTM / rnn GRU with dot,
general and mlp attention).
"""
import pytest
import torch

# The batch dimension of each state entry, written out: RNN hidden/cell are (layers, B, H).
RNN_BATCH_DIMS = {"hidden": 1, "cell": 1, "input_feed": 0, "memory": 0, "memory_proj": 0,
                  "src_mask": 0, "sentence": 0}
ATOL = 1e-5


def expected_batch_dim(name: str, key: str) -> int:
    return 0 if name == "transformer" else RNN_BATCH_DIMS[key]


def entries(model) -> dict:
    """Every state tensor in logical row order, the Transformer's self-attention cache included."""
    state = dict(model.decoder.state)
    cache = getattr(model.decoder, "cache", None)
    if cache is not None:
        for i in range(cache.buffer.size(0)):
            state[f"self_keys.{i}"], state[f"self_values.{i}"] = cache.logical(i)
    return state


def start(model, src, src_len):
    memory, final = model.encode(src, src_len)
    model.decoder.init_state(src_len, memory, final)


def steps(model, tokens: torch.Tensor):
    """Steps token by token through tokens (B, T); returns outputs (B, T, H), attention (B, T, S)."""
    outs, attns = zip(*(model.decoder.step(tokens[:, t]) for t in range(tokens.size(1))))
    return torch.stack(outs, 1), torch.stack(attns, 1)


def two_hypotheses_two_steps(model, src, src_len, tgt):
    """Every sentence tiled into two rows, then two decoding steps: a cache with a history."""
    start(model, src, src_len)
    model.decoder.map_state(lambda t, d: t.repeat_interleave(2, dim=d))
    steps(model, tgt.repeat_interleave(2, dim=0)[:, :2])


@pytest.fixture(autouse=True)
def no_grad():
    with torch.no_grad():
        yield


def test_state_entries_have_the_stated_batch_dim(model_case, padded_batch):
    name, _, model = model_case
    src, src_len, tgt = padded_batch
    start(model, src, src_len)
    steps(model, tgt[:, :2])
    keys = set(model.decoder.state)
    if name == "transformer":
        assert "src_mask" in keys and "memory_keys.0" in keys and "self_keys.1" in entries(model)
    else:
        lstm = "LSTM" in name
        assert keys == {"hidden", "input_feed", "memory", "src_mask", "sentence"} | (
            {"cell"} if lstm else set()) | ({"memory_proj"} if name.endswith("mlp") else set())
    by_id = {id(v): k for k, v in model.decoder.state.items()}
    seen = {}

    def record(tensor, dim):  # rows change sentence: every entry is reordered
        seen[by_id.get(id(tensor), "row map")] = dim
        return tensor.flip(dim)

    model.decoder.map_state(record)
    # fn selects the rows of a map that picks the source rows (and the Transformer's cache rows)
    source = {"memory", "memory_proj", "src_mask"}
    assert seen == {k: expected_batch_dim(name, k) for k in keys
                    if k not in source and not k.startswith("memory_")} | {"row map": 0}
    for key, value in entries(model).items():
        assert value.size(expected_batch_dim(name, key)) == 3, key


@pytest.mark.parametrize("select", [[2, 0, 1], [1, 1, 0], [0, 2, 2, 1], [2]],
                         ids=["permute", "duplicate", "grow", "shrink"])
def test_map_state_index_select_moves_every_entry_and_the_next_step(model_case, padded_batch,
                                                                    select):
    name, _, model = model_case
    src, src_len, tgt = padded_batch
    idx = torch.tensor(select)
    # reference: no reordering, three steps
    start(model, src, src_len)
    ref_out, ref_attn = steps(model, tgt[:, :3])
    # the same two steps, then reorder, then the third step with the reordered tokens
    start(model, src, src_len)
    steps(model, tgt[:, :2])
    before = {k: v.clone() for k, v in entries(model).items()}
    model.decoder.map_state(lambda t, d: t.index_select(d, idx))
    after = entries(model)
    assert set(after) == set(before)
    for key, value in after.items():
        dim = expected_batch_dim(name, key)
        assert value.size(dim) == len(select), key
        for row, origin in enumerate(select):
            assert torch.equal(value.select(dim, row), before[key].select(dim, origin)), \
                f"{key}: row {row} is not row {origin}"
    out, attn = model.decoder.step(tgt[idx, 2])
    for row, origin in enumerate(select):
        torch.testing.assert_close(out[row], ref_out[origin, 2], atol=ATOL, rtol=0)
        torch.testing.assert_close(attn[row], ref_attn[origin, 2], atol=ATOL, rtol=0)


def test_reorder_within_sentences_keeps_source_entries(model_case, padded_batch):
    """A beam step moves rows only within their sentence: the source side is not copied."""
    name, _, model = model_case
    src, src_len, tgt = padded_batch
    two_hypotheses_two_steps(model, src, src_len, tgt)
    before = entries(model)
    select = torch.tensor([1, 1, 2, 3, 5, 4])  # row 2b + j: each row stays in sentence b
    model.decoder.map_state(lambda t, d: t.index_select(d, select))
    source = [k for k in before if k.startswith("memory") or k == "src_mask"]
    assert source and all(model.decoder.state[k] is before[k] for k in source)
    moved = [k for k in before if k not in source and k != "sentence"]
    for key in moved:
        dim = expected_batch_dim(name, key)
        assert torch.equal(entries(model)[key], before[key].index_select(dim, select)), key


def test_repeat_interleave_tiles_each_row(model_case, padded_batch):
    """The translator's beam tiling: row b*k + j continues sentence b."""
    name, _, model = model_case
    src, src_len, tgt = padded_batch
    k = 2
    start(model, src, src_len)
    ref_out, _ = steps(model, tgt[:, :2])
    start(model, src, src_len)
    model.decoder.map_state(lambda t, d: t.repeat_interleave(k, dim=d))
    out, _ = steps(model, tgt.repeat_interleave(k, dim=0)[:, :2])
    torch.testing.assert_close(out, ref_out.repeat_interleave(k, dim=0), atol=ATOL, rtol=0)
    memory = "memory_keys.0" if name == "transformer" else "memory"
    # a sentence's rows share its memory rather than copies of it
    assert model.decoder.state[memory].size(0) == src.size(0)


def test_incremental_decoding_equals_full_prefix(model_case, padded_batch):
    _, _, model = model_case
    src, src_len, tgt = padded_batch
    start(model, src, src_len)
    full_out, full_attn = model.decoder(tgt)
    start(model, src, src_len)
    inc_out, inc_attn = steps(model, tgt)
    assert full_out.shape == (3, 4, 16) and full_attn.shape == (3, 4, 5)
    torch.testing.assert_close(inc_out, full_out, atol=ATOL, rtol=0)
    torch.testing.assert_close(inc_attn, full_attn, atol=ATOL, rtol=0)
    # a cached prefix of two, then two tokens at once (causal mask offset by the prefix)
    start(model, src, src_len)
    head_out, head_attn = model.decoder(tgt[:, :2])
    tail_out, tail_attn = model.decoder(tgt[:, 2:])
    torch.testing.assert_close(torch.cat([head_out, tail_out], 1), full_out, atol=ATOL, rtol=0)
    torch.testing.assert_close(torch.cat([head_attn, tail_attn], 1), full_attn, atol=ATOL, rtol=0)


def test_teacher_forcing_is_causal(model_case, padded_batch):
    """Changing the last target token changes no earlier output."""
    _, _, model = model_case
    src, src_len, tgt = padded_batch
    start(model, src, src_len)
    out_a, _ = model.decoder(tgt)
    changed = tgt.clone()
    changed[:, -1] = (changed[:, -1] - 4 + 1) % 7 + 4
    start(model, src, src_len)
    out_b, _ = model.decoder(changed)
    torch.testing.assert_close(out_a[:, :-1], out_b[:, :-1], atol=ATOL, rtol=0)
    assert not torch.allclose(out_a[:, -1], out_b[:, -1])


def test_attention_at_padded_source_positions_is_exactly_zero(model_case, padded_batch):
    _, _, model = model_case
    src, src_len, tgt = padded_batch
    start(model, src, src_len)
    _, full_attn = model.decoder(tgt)
    start(model, src, src_len)
    _, inc_attn = steps(model, tgt)
    for attn in (full_attn, inc_attn):
        for row, n in enumerate(src_len.tolist()):
            assert torch.all(attn[row, :, n:] == 0), f"row {row} attends to padding"
            assert torch.all(attn[row, :, :n] > 0)
            torch.testing.assert_close(attn[row].sum(-1), torch.ones(4), atol=1e-6, rtol=0)


def test_padding_does_not_change_a_sentence(model_case, padded_batch):
    """A padded row decodes exactly as the same sentence alone, without padding."""
    _, _, model = model_case
    src, src_len, tgt = padded_batch
    start(model, src, src_len)
    batch_out, batch_attn = model.decoder(tgt)
    for row, n in enumerate(src_len.tolist()):
        start(model, src[row:row + 1, :n], src_len[row:row + 1])
        out, attn = model.decoder(tgt[row:row + 1])
        torch.testing.assert_close(out[0], batch_out[row], atol=ATOL, rtol=0)
        torch.testing.assert_close(attn[0], batch_attn[row, :, :n], atol=ATOL, rtol=0)


def test_forward_log_probs_are_normalized(model_case, padded_batch, tgt_vocab):
    _, _, model = model_case
    src, src_len, tgt = padded_batch
    log_probs, attn = model(src, src_len, tgt)
    assert log_probs.shape == (3, 4, len(tgt_vocab)) and attn.shape == (3, 4, 5)
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(3, 4), atol=1e-5, rtol=0)


def test_map_state_to_no_rows(model_case, padded_batch):
    """Every sentence finished at once: each entry, the Transformer's cache too, has no rows."""
    name, _, model = model_case
    src, src_len, tgt = padded_batch
    two_hypotheses_two_steps(model, src, src_len, tgt)
    none = torch.tensor([], dtype=torch.long)
    model.decoder.map_state(lambda t, d: t.index_select(d, none))
    for key, value in entries(model).items():
        assert value.size(expected_batch_dim(name, key)) == 0, key
