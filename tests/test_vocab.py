"""Vocab: building (frequency, size, padding), specials, encode/decode, refusals."""
import pytest

from onmt_lite.vocab import Vocab

SPECIALS = ["<unk>", "<blank>", "<s>", "</s>"]
# counts: a 3, b 2, c 1, d 1, e 1
LINES = ["b a c a", "a b d", "e"]


def test_build_orders_by_count_then_alphabetically_after_specials():
    vocab = Vocab.build(LINES)
    assert vocab.itos == SPECIALS + ["a", "b", "c", "d", "e"]
    assert (vocab.unk, vocab.pad, vocab.bos, vocab.eos) == (0, 1, 2, 3)
    assert len(vocab) == 9


def test_build_min_frequency():
    assert Vocab.build(LINES, min_freq=2).itos == SPECIALS + ["a", "b"]
    assert Vocab.build(LINES, min_freq=4).itos == SPECIALS


def test_build_max_size_excludes_specials_and_breaks_ties_alphabetically():
    assert Vocab.build(LINES, max_size=3).itos == SPECIALS + ["a", "b", "c"]
    assert Vocab.build(LINES, max_size=0).itos == SPECIALS + ["a", "b", "c", "d", "e"]


def test_build_ignores_specials_in_the_text():
    vocab = Vocab.build(["<unk> <s> x </s> <blank> x"])
    assert vocab.itos == SPECIALS + ["x"]


def test_size_multiple_pads_with_fillers():
    # 4 specials + 5 words = 9 -> 16: seven fillers numbered from 0
    vocab = Vocab.build(LINES, size_multiple=8)
    assert len(vocab) == 16
    assert vocab.itos[:9] == SPECIALS + ["a", "b", "c", "d", "e"]
    assert vocab.itos[9:] == [f"averyunlikelytoken{i}" for i in range(7)]


def test_size_multiple_already_met_adds_nothing():
    # 4 specials + 2 words = 6, a multiple of 3 and of 2
    assert Vocab.build(LINES, min_freq=2, size_multiple=3).itos == SPECIALS + ["a", "b"]
    assert len(Vocab.build(LINES, min_freq=2, size_multiple=2)) == 6


def test_encode_maps_unknown_tokens_to_unk_and_decode_inverts():
    vocab = Vocab.build(LINES)
    ids = vocab.encode(["a", "zzz", "e", "A"])
    assert ids == [4, 0, 8, 0]
    assert vocab.decode(ids) == ["a", "<unk>", "e", "<unk>"]
    assert vocab.decode(vocab.encode(["b", "c", "d"])) == ["b", "c", "d"]


def test_vocab_from_token_list_keeps_order():
    vocab = Vocab(SPECIALS + ["x", "y"])
    assert vocab.stoi["y"] == 5 and vocab.itos[4] == "x"
    # the specials need not come first in a given list (OpenNMT-py's files put them first)
    other = Vocab(["x"] + SPECIALS)
    assert (other.unk, other.pad, other.bos, other.eos) == (1, 2, 3, 4)


@pytest.mark.parametrize("missing", SPECIALS)
def test_refuses_a_vocabulary_lacking_a_special(missing):
    tokens = [t for t in SPECIALS if t != missing] + ["x"]
    with pytest.raises(ValueError, match="lacks the special tokens") as err:
        Vocab(tokens)
    assert missing in str(err.value)


def test_refuses_duplicate_tokens():
    with pytest.raises(ValueError, match="duplicate"):
        Vocab(SPECIALS + ["x", "y", "x"])
