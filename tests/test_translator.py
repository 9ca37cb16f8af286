"""Translator end to end with a table-driven stub model.

The stub's next-token distribution is a fixed table keyed by the target prefix (the words
after <s>); each source sentence picks its table by its first word. The decoder state holds,
per row, the source ids and the prefix ids, so a row's prefix is exactly the history that
map_state made it follow. ``step`` asserts that every prefix is a path the table allows (a
finished hypothesis is stepped once more after its </s>), so a hypothesis fed another
hypothesis's state fails at once. Every map_state call is recorded as the row selection it
makes (fn applied to arange(rows)).

Vocabulary (source and target): 0 <unk>, 1 <blank>, 2 <s>, 3 </s>, 4 A, 5 B, 6 C.
"""
import math

import pytest
import torch

from onmt_lite.translate import DecodingOptions, Translator
from onmt_lite.vocab import Vocab

torch.set_num_threads(1)

VOCAB = Vocab(["<unk>", "<blank>", "<s>", "</s>", "A", "B", "C"])
EOS = "</s>"

# Sources starting with A. The classic case:
#   greedy: A .5, then B .4 (> C .3), then C .6, then </s> .4: .5 * .4 * .6 * .4 = .048
#   beam 2: step 1 A .5, B .3
#           step 2 AB .5 * .4 = .20, AC .5 * .3 = .15 (B-branch: BA .3 * .4 = .12, B</s> .105)
#           step 3 ABC .20 * .6 = .12, ACB .15 * .6 = .09 (AB</s> .06, AC</s> .045)
#           step 4 ACB</s> .09 * .6 = .054 on top, ABC</s> .12 * .4 = .048: done
TABLE_A = {
    (): {"A": .5, "B": .3, "C": .2},
    ("A",): {"B": .4, "C": .3, EOS: .2, "A": .1},
    ("B",): {"A": .4, EOS: .35, "C": .25},
    ("A", "B"): {"C": .6, EOS: .3, "A": .1},
    ("A", "C"): {"B": .6, EOS: .3, "A": .1},
    ("A", "B", "C"): {EOS: .4, "B": .35, "A": .25},
    ("A", "C", "B"): {EOS: .6, "A": .4},
}
# Sources starting with B:
#   greedy: B .7, </s> .6: .42
#   beam 2: step 1 B .7, C .2; step 2 B</s> .42 on top, BA .21 (CA .12, C</s> .08, BC .07)
#           n_best 2: step 3 BA</s> .21 * .5 = .105 on top, BAC .063
TABLE_B = {
    (): {"B": .7, "C": .2, EOS: .1},
    ("B",): {EOS: .6, "A": .3, "C": .1},
    ("C",): {"A": .6, EOS: .4},
    ("B", "A"): {EOS: .5, "C": .3, "B": .2},
}
# Sources starting with C:
#   greedy: C .9, </s> .8: .72
#   beam 2: step 1 C .9, A .1; step 2 C</s> .72 on top, CB .18 (A</s> .06, AB .04)
TABLE_C = {
    (): {"C": .9, "A": .1},
    ("C",): {EOS: .8, "B": .2},
    ("A",): {EOS: .6, "B": .4},
}
TABLES = {"A": TABLE_A, "B": TABLE_B, "C": TABLE_C}
# What a hypothesis that already ended in </s> sees (its score is -65504 anyway).
AFTER_EOS = {EOS: 1.0}


class TableDecoder:
    """Decoder state: {"src": (B, S) source ids, "prefix": (B, t) target ids, <s> first}."""

    def __init__(self):
        self.state = None
        self.selections = []  # one list of selected rows per map_state call
        self.prefixes = []  # per step: the prefix words of every row

    def init_state(self, src_len, memory, final):
        assert final is None
        src = memory[:, :, 0].long()  # the stub encoder copies the ids into memory
        self.state = {"src": src, "prefix": torch.empty(src.size(0), 0, dtype=torch.long)}

    def map_state(self, fn):
        rows = self.state["src"].size(0)
        self.selections.append(fn(torch.arange(rows), 0).tolist())
        self.state = {name: fn(tensor, 0) for name, tensor in self.state.items()}

    def step(self, tokens):
        assert tokens.shape == (self.state["src"].size(0),)
        prefix = torch.cat([self.state["prefix"], tokens.view(-1, 1)], dim=1)
        self.state["prefix"] = prefix
        rows, attn, words_of_rows = [], [], []
        for src_ids, ids in zip(self.state["src"].tolist(), prefix.tolist()):
            source = [w for w in VOCAB.decode(src_ids) if w != "<blank>"]
            table = TABLES[source[0]]
            assert ids[0] == VOCAB.bos
            words = tuple(VOCAB.decode(ids[1:]))
            _assert_allowed_path(table, words)
            words_of_rows.append(words)
            probs = AFTER_EOS if words and words[-1] == EOS else table[words]
            rows.append([probs.get(tok, 0.0) for tok in VOCAB.itos])
            attn.append([1.0 / len(source) if w != "<blank>" else 0.0
                         for w in VOCAB.decode(src_ids)])
        self.prefixes.append(words_of_rows)
        return torch.tensor(rows).log(), torch.tensor(attn)


def _assert_allowed_path(table, words):
    """Each word had a non-zero probability after the words before it; the prefix is a key
    of the table or a key followed by </s>."""
    for i, word in enumerate(words):
        assert words[:i] in table, f"prefix {words[:i]} is not a path of the table"
        assert table[words[:i]].get(word, 0.0) > 0, f"{word} is impossible after {words[:i]}"
    assert words in table or words[-1] == EOS, f"prefix {words} is not a path of the table"


class TableModel:
    def __init__(self):
        self.decoder = TableDecoder()

    def encode(self, src, src_len):
        memory = src.unsqueeze(-1).float().repeat(1, 1, 2)  # (B, S, H=2)
        return memory, None

    def log_probs(self, out):
        return out


ENGINE = {"name": "batch"}


@pytest.fixture(autouse=True, params=["batch", "sentence"])
def engine(request):
    """Every test runs with both beam engines."""
    ENGINE["name"] = request.param
    return request.param


def translate(lines, batch_size=30, **options):
    options.setdefault("beam_engine", ENGINE["name"])
    options.setdefault("max_length_ratio", 0)
    options.setdefault("length_penalty", "none")
    model = TableModel()
    translator = Translator(model, VOCAB, VOCAB, DecodingOptions(**options))
    return translator.translate(lines, batch_size=batch_size), model.decoder


# -- the classic case -------------------------------------------------------------------------
def test_greedy_finds_the_locally_best_path():
    (result,), _ = translate(["A"], beam_size=1)
    assert result.preds == [["A", "B", "C"]]
    assert result.scores[0] == pytest.approx(math.log(0.048), abs=1e-5)  # .5 * .4 * .6 * .4


def test_beam_2_finds_the_better_path():
    (result,), decoder = translate(["A"], beam_size=2)
    assert result.preds == [["A", "C", "B"]]
    assert result.scores[0] == pytest.approx(math.log(0.054), abs=1e-5)  # .5 * .3 * .6 * .6
    # one attention row per token, </s> included; a single source word gets it all
    assert result.attns[0].tolist() == [[1.0], [1.0], [1.0], [1.0]]


def test_map_state_makes_each_hypothesis_follow_its_own_history():
    _, decoder = translate(["A"], beam_size=2)
    # the prefix each row is stepped with (see TABLE_A): rows follow their hypotheses
    # the batch engine runs step 1 on one row per sentence (only hypothesis 0 is extended)
    first = [()] if ENGINE["name"] == "batch" else [(), ()]
    assert decoder.prefixes == [
        first,                               # step 1: rows start from <s>
        [("A",), ("B",)],                    # step 2: [A, B] from [0, 0]
        [("A", "B"), ("A", "C")],            # step 3: [AB, AC] from [0, 0]
        [("A", "B", "C"), ("A", "C", "B")],  # step 4: [ABC, ACB] from [0, 1]
    ]
    assert decoder.selections == [
        [0, 0],  # tile the one encoded sentence beam_size = 2 times
        [0, 0],  # after step 1: A and B both extend row 0
        [0, 0],  # after step 2: AB and AC both extend row 0 (A)
        [0, 1],  # after step 3: ABC from row 0 (AB), ACB from row 1 (AC)
    ]  # after step 4 the beam is done: no more map_state


def test_map_state_selections_with_several_sentences():
    lines = ["A", "B C", "C A B", "A A", "B"]
    results, decoder = translate(lines, beam_size=2)
    assert [r.preds[0] for r in results] == [["A", "C", "B"], ["B"], ["C"], ["A", "C", "B"],
                                             ["B"]]
    # decoding order, by source length (stable): lines 0 (A), 4 (B), 1 (B C), 3 (A A),
    # 2 (C A B); beam rows 2i, 2i + 1 belong to the i-th of them
    assert decoder.selections == [
        [0, 0, 1, 1, 2, 2, 3, 3, 4, 4],  # tile by 2
        [0, 0, 2, 2, 4, 4, 6, 6, 8, 8],  # step 1: every beam extends its own row 0
        # step 2: the B and C sentences are done (B</s>, C</s> on top) and leave;
        # the A sentences (blocks 0 and 3) extend their row 0: [0, 0] + 0, [0, 0] + 3 * 2
        [0, 0, 6, 6],
        [0, 1, 2, 3],  # step 3: [ABC, ACB] from [0, 1] in each block
    ]


def test_greedy_shrinks_the_batch_as_sentences_finish():
    lines = ["A", "B", "C A"]
    results, decoder = translate(lines, beam_size=1)
    assert [r.preds[0] for r in results] == [["A", "B", "C"], ["B"], ["C"]]
    # decoding order: A, B, C A; B and C A end at step 2 and leave; A goes on alone
    assert decoder.selections == [[0]]
    assert decoder.prefixes[-1] == [("A", "B", "C")]


# -- n-best, order, batching ------------------------------------------------------------------
def test_n_best_returns_n_hypotheses_best_first():
    results, _ = translate(["A", "B"], beam_size=2, n_best=2)
    assert results[0].preds == [["A", "C", "B"], ["A", "B", "C"]]
    # .5 * .3 * .6 * .6 = .054, .5 * .4 * .6 * .4 = .048
    assert results[0].scores == pytest.approx([math.log(0.054), math.log(0.048)], abs=1e-5)
    assert results[1].preds == [["B"], ["B", "A"]]
    # .7 * .6 = .42, .7 * .3 * .5 = .105
    assert results[1].scores == pytest.approx([math.log(0.42), math.log(0.105)], abs=1e-5)
    assert results[1].output_lines() == ["B", "B A"]


def test_without_the_attention_the_search_is_the_same(engine):
    lines = ["A", "B", "A B"]
    kept, _ = translate(lines, beam_size=2, n_best=2)
    dropped, _ = translate(lines, beam_size=2, n_best=2, keep_attention=False)
    assert [r.preds for r in dropped] == [r.preds for r in kept]
    assert [r.scores for r in dropped] == [r.scores for r in kept]
    if engine == "batch":  # the sentence engine's Beam keeps its per-step attention anyway
        assert [[tuple(a.shape) for a in r.attns] for r in dropped] == \
            [[(len(a), 0) for a in r.attns] for r in kept]
    with pytest.raises(ValueError, match="-replace_unk reads the attention"):
        translate(lines, replace_unk=True, keep_attention=False)


def test_results_come_back_in_input_order():
    lines = ["C A B", "A", "", "B C", "A A", "B"]
    results, _ = translate(lines, beam_size=2, batch_size=2)
    assert [r.index for r in results] == [0, 1, 2, 3, 4, 5]
    assert [r.src for r in results] == [line.split() for line in lines]
    assert [r.preds[0] for r in results] == [["C"], ["A", "C", "B"], [], ["B"],
                                             ["A", "C", "B"], ["B"]]
    expected = [math.log(.72), math.log(.054), 0.0, math.log(.42), math.log(.054),
                math.log(.42)]
    assert [r.scores[0] for r in results] == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("beam_size", [1, 2])
def test_batch_size_does_not_change_the_output(beam_size):
    lines = ["A", "B C", "C A B", "", "A A", "B", "C"]
    outputs = []
    for batch_size in (1, 2, 32):
        results, _ = translate(lines, beam_size=beam_size, batch_size=batch_size)
        outputs.append(results)
    reference = outputs[0]
    for results in outputs[1:]:
        assert [r.preds for r in results] == [r.preds for r in reference]
        assert [r.scores for r in results] == [r.scores for r in reference]
        for mine, ref in zip(results, reference):
            assert len(mine.attns) == len(ref.attns)
            for a, b in zip(mine.attns, ref.attns):
                assert torch.equal(a, b)


@pytest.mark.parametrize("beam_size", [1, 2])
def test_max_length_cuts_the_hypotheses(beam_size):
    (result,), decoder = translate(["A"], beam_size=beam_size, max_length=2)
    # greedy: A .5, B .4; beam 2: AB .20 beats AC .15 at step 2. Both stop there, no </s>.
    assert result.preds == [["A", "B"]]
    assert result.scores[0] == pytest.approx(math.log(.2), abs=1e-5)  # .5 * .4
    assert result.attns[0].shape == (2, 1)
    assert len(decoder.prefixes) == 2


def test_empty_line_gives_an_empty_translation():
    results, decoder = translate(["", "B", ""], beam_size=2, n_best=2)
    assert results[0].preds == [[], []]
    assert results[0].scores == [0.0, 0.0]
    assert results[2].preds == [[], []]
    assert results[1].preds == [["B"], ["B", "A"]]
    assert results[0].output_lines() == ["", ""]


def test_only_empty_lines_never_call_the_model():
    results, decoder = translate(["", ""], beam_size=2)
    assert [r.preds for r in results] == [[[]], [[]]]
    assert decoder.prefixes == [] and decoder.selections == []


def test_stub_rejects_a_prefix_outside_the_table():
    # the check that makes the map_state tests meaningful
    with pytest.raises(AssertionError):
        _assert_allowed_path(TABLE_A, ("B", "C"))  # B C is possible but not a key
    with pytest.raises(AssertionError):
        _assert_allowed_path(TABLE_A, ("C",))
    _assert_allowed_path(TABLE_A, ("B", EOS))  # a finished hypothesis stepped once more


def test_token_batches_respect_the_budget():
    translator = Translator(TableModel(), VOCAB, VOCAB, DecodingOptions())
    lines = [["A"] * n for n in (3, 1, 2, 2, 5, 1)]
    batches = list(translator._batches(lines, None, 4, "tokens"))
    # sorted by length: 1 1 2 2 3 5 -> [1 1] (2x2=4 would fit; 3x2=6 does not) ...
    assert [[len(lines[i]) for i in b] for b in batches] == [[1, 1], [2, 2], [3], [5]]
    assert all(len(b) * max(len(lines[i]) for i in b) <= 4 or len(b) == 1 for b in batches)
