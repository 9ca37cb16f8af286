"""Searches whose decoder steps run together (the server's continuous batching): a batch that
joins others at any step translates as it does alone, and one search's error ends only it."""
import os
import time

import pytest
import torch

from onmt_lite.models import shared_step
from onmt_lite.models.compiled_step import CompiledOutput, CompiledStep, compile_encoder
from onmt_lite.models.model import inference, replica
from onmt_lite.models.shared_step import Searches
from onmt_lite.translate.build import build_translator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "data", "multi30k_en_de_raw.pt")
RNN = os.path.join(ROOT, "..", "shared", "fixtures", "onmt-py", "rnn.pt")
DEMO = [line.strip() for line in open(os.path.join(ROOT, "data", "demo.en"), encoding="utf-8")]


def _search(translator, lines, join: bool = False):
    twin = translator.__class__.__new__(translator.__class__)
    twin.__dict__.update(translator.__dict__, model=replica(translator.model))
    tokens = [translator.source_tokens(line, i + 1) for i, line in enumerate(lines)]
    return twin.batch_steps(list(range(len(tokens))), tokens, None, shared=True, join=join)


def _joined_at_steps(translator, batches, joins):
    """Each batch's translations, batch i joining the others after ``joins[i]`` steps; each
    sentence is also reported as it ends, once, with the translation the batch returns."""
    searches, ended, sentences, step = Searches(), {}, {}, 0

    def record(events):
        for tag, kind, value in events:
            assert kind != "error", value
            if kind == "ended":
                place, translation = value
                assert (tag, place) not in sentences
                sentences[tag, place] = translation
            else:
                ended[tag] = value
    with inference():
        while len(ended) < len(batches):
            for i, join in enumerate(joins):
                if join == step:
                    record(searches.add(i, _search(translator, batches[i])))
            record(searches.step() if searches else [])
            step += 1
    for i, translations in ended.items():
        assert [sentences[i, place] for place in range(len(translations))] == translations
    return [ended[i] for i in range(len(batches))]


def _same_as_alone(translator, batches, joins):
    for lines, got in zip(batches, _joined_at_steps(translator, batches, joins)):
        alone = translator.translate(lines, batch_size=len(lines))
        assert [t.output_lines() for t in got] == [t.output_lines() for t in alone]
        assert [s for t in got for s in t.scores] == pytest.approx(
            [s for t in alone for s in t.scores], abs=1e-5)


@pytest.mark.parametrize("beam_size, n_best", [(5, 2), (1, 1)])
def test_batches_that_join_at_different_steps_translate_as_alone(beam_size, n_best, monkeypatch):
    translator = build_translator({"model": MODEL, "beam_size": beam_size, "n_best": n_best,
                                   "max_length_ratio": 0})
    rows = []
    joined = shared_step._transformer_steps
    monkeypatch.setattr(shared_step, "_transformer_steps",
                        lambda requests: rows.append(len(requests)) or joined(requests))
    batches = [DEMO[:3], DEMO[3:4], DEMO[4:] + DEMO[:2]]
    _same_as_alone(translator, batches, joins=[0, 2, 4])
    assert max(rows) == 3  # the three batches' steps ran as one


@pytest.mark.parametrize("options", [
    {"fast": True, "precision": "fp32"},
    {"fast": True, "precision": "fp32", "search": "ctranslate2", "alpha": 0.2}],
    ids=["fast", "fast-ctranslate2"])
def test_fast_layers_step_several_searches_as_one(options, monkeypatch):
    """The fast layers' steps of several searches (CTranslate2's rule takes no sentences
    between steps: each batch is a search of its own) run as one: their products take every
    search's rows; each sentence's translation is the one its batch gets decoded alone."""
    translator = build_translator({"model": MODEL, "beam_size": 4, "max_length_ratio": 0,
                                   **options})
    rows = []
    joined = shared_step._fast_steps
    monkeypatch.setattr(shared_step, "_fast_steps",
                        lambda requests: rows.append(len(requests)) or joined(requests))
    _same_as_alone(translator, [DEMO[:3], DEMO[3:4], DEMO[4:] + DEMO[:2]], joins=[0, 2, 4])
    assert max(rows) == 3  # the three batches' steps ran as one


@pytest.mark.skipif(not os.path.exists(RNN), reason="needs ../shared (the OpenNMT-py RNN fixture)")
def test_decoders_that_cannot_join_step_one_after_the_other():
    translator = build_translator({"model": RNN, "beam_size": 5, "max_length_ratio": 0})
    lines = [line.strip() for line in open(os.path.join(ROOT, "data", "demo.lc.en"),
                                           encoding="utf-8")]
    _same_as_alone(translator, [lines[:2], lines[2:]], joins=[0, 2])


def _joining(translator, first, arrivals):
    """The translations of ``first``'s sentences, then of the batches ``arrivals[step]``
    offered to its search after that many steps (in order), as each is reported when it ends
    (once each)."""
    searches, answered, returned = Searches(), {}, None
    with inference():
        events = searches.add("search", _search(translator, first, join=True))
        step = 0
        while searches:
            for lines in arrivals.get(step, []):
                tokens = [translator.source_tokens(line, 1) for line in lines]
                assert searches.offer("search", tokens)
            events += searches.step()
            step += 1
    for _, kind, value in events:
        assert kind in ("ended", "joined", "done"), value
        if kind == "ended":
            assert value[0] not in answered
            answered[value[0]] = value[1]
        else:
            returned = value
    assert [answered[i] for i in range(len(answered))] == returned
    return returned


def _compiled(translator) -> list:
    """Gives the translator -compile's encoder, whole step and output programs, run uncompiled here
    (the same operations: test_fast.py); returns, for each step the step program takes, how
    many positions its rows stand at."""
    model, positions = translator.model, []

    def build(program, args, shapes, name, inline=False):
        if not name.startswith("step-"):  # the memory's keys and values
            return program
        return lambda *args: positions.append(args[1].unique().numel()) or program(*args)
    model.decoder.compiled_step = CompiledStep(model.decoder, build)
    model.compiled_output = CompiledOutput(model.generator, lambda program, *_: program)
    model.compiled_encoder = compile_encoder(model.encoder, lambda program, *_: program)
    return positions


@pytest.mark.parametrize("options", [
    {"beam_size": 5, "n_best": 2},
    {"beam_size": 5, "length_penalty": "wu", "alpha": 0.6, "max_length": 6},
    {"beam_size": 1},
    {"beam_size": 5, "fast": True, "precision": "fp32"},
    {"beam_size": 5, "n_best": 2, "fast": True, "compile": True, "precision": "fp32"}],
    ids=["n_best", "wu-max_length", "greedy", "fast", "compiled"])
def test_sentences_that_join_a_running_search_translate_as_alone(options, monkeypatch):
    """Sentences join between steps (1 to 3 a time, one at the first step): each decodes at its
    own positions, with its own step count, length penalty and limit, and gets the translation
    and score it gets decoded alone. The fast step's layers and the compiled whole step take
    sentences too (their memory keys transposed, their source mask a bias; a lone sentence's
    steps, alone or once the others have ended, run through the masked layers)."""
    compiled = options.pop("compile", False)
    if compiled:  # the programs are made of the fast layers' torch products, as -compile's
        monkeypatch.setattr("onmt_lite.models.inference.mkl_is_slow", lambda: False)
    translator = build_translator({"model": MODEL, "max_length_ratio": 0, **options})
    positions = _compiled(translator) if compiled else []
    assert translator.joinable()
    lines = DEMO + [line.lower() for line in DEMO]
    first, arrivals = lines[:2], {0: [lines[2:3]], 2: [lines[3:5]], 3: [lines[5:6], lines[6:9]],
                                  9: [lines[9:]]}
    got = _joining(translator, first, arrivals)
    assert not compiled or max(positions) >= 3  # the program stepped rows at their own
    alone = [translator.translate([line], batch_size=1)[0] for line in lines]
    assert [t.output_lines() for t in got] == [t.output_lines() for t in alone]
    assert [s for t in got for s in t.scores] == pytest.approx(
        [s for t in alone for s in t.scores], abs=1e-5)
    for t, a in zip(got, alone):  # each hypothesis' attention: its own rows and source
        assert [x.shape for x in t.attns] == [x.shape for x in a.attns]
        assert all(torch.allclose(x, y, atol=1e-5) for x, y in zip(t.attns, a.attns))
    if options.get("max_length"):
        assert max(len(t.preds[0]) for t in got) == options["max_length"]


def test_a_search_takes_no_sentences_where_its_rule_reads_the_whole_batch():
    """Coverage penalties read the source width, -ratio other sentences' lengths: such a
    search is a search of its own, and an offer to it is refused."""
    translator = build_translator({"model": MODEL, "coverage_penalty": "wu", "beta": 0.2})
    searches = Searches()
    with inference():
        searches.add("search", _search(translator, DEMO[:1], join=True))
        assert not searches.offer("search", [["Hello"]])


class _Decoder:
    """A stand-in decoder whose step doubles its tokens, or fails."""

    def __init__(self, fails: bool):
        self.fails = fails

    def step(self, tokens):
        if self.fails:
            raise ValueError("sequence longer than 8 positions")
        return tokens * 2


def _toy_search(decoder, steps: int):
    tokens = torch.ones(2)
    for _ in range(steps):
        tokens = yield "step", decoder, tokens
    return tokens.tolist()


def _toy_joining(decoder, steps: int):
    tokens, taken = torch.ones(2), []
    for _ in range(steps):
        taken.append((yield "join",))
        tokens = yield "step", decoder, tokens
    return taken


def test_what_a_search_did_not_take_before_it_ended_comes_back():
    searches = Searches()
    assert searches.add("search", _toy_joining(_Decoder(False), 2)) == []
    assert searches.offer("search", "first")
    assert searches.step() == [("search", "joined", ["first"])]
    assert searches.offer("search", "second")
    assert searches.step() == [("search", "unjoined", ["second"]),
                               ("search", "done", [None, ["first"]])]
    assert not searches.offer("search", "third")


def test_a_search_whose_step_fails_ends_alone():
    searches = Searches()
    assert searches.add("good", _toy_search(_Decoder(False), 3)) == []
    assert searches.add("bad", _toy_search(_Decoder(True), 3)) == []
    ended = searches.step()
    assert [(tag, kind, type(value), str(value)) for tag, kind, value in ended] == [
        ("bad", "error", ValueError, "sequence longer than 8 positions")]
    assert searches.step() == [] and len(searches) == 1
    assert searches.step() == [("good", "done", [8.0, 8.0])]


@pytest.mark.parametrize("sentences, share", [(8, 1 / 2), (1, 1 / 3)])
def test_short_sentences_beside_long_ones_step_alone_for_a_share_of_the_time(sentences, share):
    """Turns, on a lane with a search of 10 sentences of 30 tokens: newcomers of 5 tokens,
    arriving one batch after another, take steps alone, but the long sentences still get half
    the lane's time (a third beside a few sentences, FEW_AHEAD); a newcomer as long as the
    sentences there steps with them."""
    from onmt_lite.serve.lane_process import FEW_AHEAD, Turns, _Batch, _Chunk, _Search
    assert (sentences <= FEW_AHEAD) == (share < 1 / 2)

    def search(sentences, length):
        found = _Search((1, False))
        found.add(_Chunk((1, False), _Batch(0, list(range(sentences)), False,
                                            [length] * sentences),
                         list(range(sentences)), [["x"] * length] * sentences))
        return found
    turns, long = Turns(head_start=0.5), search(10, 30)
    running, now, long_time, alone_steps = [long], 0.0, 0.0, 0
    while now < 5:
        if not any(s.ahead_until > now for s in running[1:]):  # the next short batch
            short = search(sentences, 5)
            short.ahead_until = turns.ahead_until([5] * sentences, [long], now)
            assert short.ahead_until == now + 0.5
            running = [long, short]
        only = turns.choose(running, now)
        seconds = 0.002 if only else 0.006  # a step alone is a third of a joined one
        alone_steps += only is not None
        long_time += 0 if only else seconds
        turns.took(only, seconds)
        now += seconds
    assert alone_steps > 0 and share - 0.01 <= long_time / now <= share + 0.05
    assert turns.ahead_until([30], [long], now) == 0.0 and turns.choose([long, search(1, 30)],
                                                                        now) is None


def test_a_search_keeps_the_lengths_of_its_sentences_still_decoding():
    """What Turns reads at every step and every batch, kept as sentences end rather than
    recounted over every sentence a long-running search ever took."""
    from onmt_lite.serve.lane_process import _Batch, _Chunk, _Search
    search = _Search((1, False))
    for lengths in ([3, 7], [5]):
        batch = _Batch(0, list(range(len(lengths))), False, lengths)
        search.add(_Chunk((1, False), batch, list(range(len(lengths))),
                          [["x"] * n for n in lengths]))
    assert search.ended(1) == (search.places[1][0], 1)
    assert search.decoding == {0: 3, 2: 5}


def test_long_sentences_arriving_beside_short_ones_let_them_step_alone():
    """A batch whose every sentence is at least twice as long as every sentence of the running
    search starts a search of its own instead of joining it, and the short one steps alone
    (Turns) for its head start; a short batch beside a long one still waiting to start steps
    alone at once too (rather than waiting behind it, then joining it); each translation is
    its own alone."""
    from types import SimpleNamespace

    from onmt_lite.serve.lane_process import Turns, _Batch, _LaneSearches
    translator = build_translator({"model": MODEL, "max_length_ratio": 0})
    lane, messages = _LaneSearches(translator, Turns(0.5)), []
    conn = SimpleNamespace(send=messages.append)
    short, long = DEMO[0], " ".join(DEMO[:4])
    lines = [short, long, short]
    tokens = [translator.source_tokens(line, 1) for line in lines]
    assert 2 * len(tokens[0]) <= len(tokens[1])
    with inference():
        lane.admit(conn, _Batch(0, [0], False, [len(tokens[0])]), [tokens[0]], 1)
        lane.start_waiting(conn)
        lane.step(conn)
        first = lane.open[(1, False)]
        lane.admit(conn, _Batch(1, [0], False, [len(tokens[1])]), [tokens[1]], 1)
        lane.start_waiting(conn)
        assert len(lane.searches) == 2 and lane.open[(1, False)] is not first
        assert first.ahead_until > time.monotonic()  # the short search steps alone
        assert lane.turns.choose(lane.searches.tags(), time.monotonic()) is not None
        lane.admit(conn, _Batch(2, [0], False, [len(tokens[2])]), [tokens[2]], 1)  # ahead too
        assert len(lane.searches) == 3
        while lane.busy():
            lane.start_waiting(conn)
            lane.step(conn)
        idle = _LaneSearches(translator, Turns(0.5))  # a long batch waiting to start on an
        idle.admit(conn, _Batch(3, [0], False, [len(tokens[1])]), [tokens[1]], 1)  # idle lane
        assert len(idle.waiting) == 1 and not idle.searches
        idle.admit(conn, _Batch(4, [0], False, [len(tokens[0])]), [tokens[0]], 1)
        assert len(idle.searches) == 1 and len(idle.waiting) == 1  # the short one: at once
        assert idle.searches.tags()[0].ahead_until > time.monotonic()
        while idle.busy():
            idle.start_waiting(conn)
            idle.step(conn)
    alone = [t.output_lines() for t in translator.translate(lines + lines[1:2] + lines[:1],
                                                            batch_size=1)]
    assert sorted((m[1], m[3][0]) for m in messages if m[0] == "sentence") == list(
        enumerate(alone))


def test_a_lane_starts_a_long_batch_in_chunks_and_answers_each_sentence_once():
    """A batch of more source tokens than JOIN_TOKENS starts a step's worth at a time, its
    chunks joining the search the first one started; each sentence is answered once, with
    its translation alone, and the batch ends once all are."""
    from types import SimpleNamespace

    from onmt_lite.serve.lane_process import JOIN_TOKENS, Turns, _Batch, _LaneSearches
    translator = build_translator({"model": MODEL, "max_length_ratio": 0})
    lane, messages = _LaneSearches(translator, Turns(0.5)), []
    lines = [f"{DEMO[i % len(DEMO)]} {DEMO[(i + 1) % len(DEMO)]}" for i in range(12)]
    tokens = [translator.source_tokens(line, 1) for line in lines]
    order = sorted(range(len(lines)), key=lambda i: len(tokens[i]))
    with inference():
        ordered = [tokens[i] for i in order]
        lane.admit(SimpleNamespace(send=messages.append),
                   _Batch(7, order, False, [len(t) for t in ordered]), ordered,
                   translator.opt.n_best)
        chunks = len(lane.waiting)
        while lane.busy():
            lane.start_waiting(SimpleNamespace(send=messages.append))
            lane.step(SimpleNamespace(send=messages.append))
    assert chunks >= sum(map(len, tokens)) // JOIN_TOKENS >= 2
    answers = [m for m in messages if m[0] == "sentence"]
    assert sorted(index for _, _, index, _ in answers) == list(range(len(lines)))
    alone = [t.output_lines() for t in translator.translate(lines, batch_size=1)]
    assert {index: result[0] for _, _, index, result in answers} == dict(enumerate(alone))
    assert messages[-1] == ("done", 7, [None] * len(lines)) and len(messages) == len(lines) + 1


def test_a_chunk_offered_to_a_search_that_ends_starts_anew():
    from types import SimpleNamespace

    from onmt_lite.serve.lane_process import Turns, _Batch, _LaneSearches
    translator = build_translator({"model": MODEL, "max_length": 1})
    lane, messages = _LaneSearches(translator, Turns(0.5)), []
    conn = SimpleNamespace(send=messages.append)
    with inference():
        for batch_id, line in enumerate(DEMO[:2]):
            tokens = translator.source_tokens(line, 1)
            lane.admit(conn, _Batch(batch_id, [0], False, [len(tokens)]), [tokens],
                       translator.opt.n_best)
            lane.start_waiting(conn)  # the first starts a search; the second is offered to it
        assert len(lane.searches) == 1 and not lane.waiting
        while lane.searches and not lane.waiting:
            lane.step(conn)  # the first search ends at its limit, before it takes the second
        assert len(lane.waiting) == 1 and not lane.searches
        while lane.busy():
            lane.start_waiting(conn)
            lane.step(conn)
    alone = [t.output_lines() for t in translator.translate(DEMO[:2], batch_size=1)]
    assert [(m[1], m[3][0]) for m in messages if m[0] == "sentence"] == list(enumerate(alone))
    assert [m[:2] for m in messages if m[0] == "done"] == [("done", 0), ("done", 1)]


def test_int8_decoders_with_programs_for_a_few_rows_step_together(monkeypatch):
    """-compile -int8: several searches' steps run as one through the int8 layers (their rows
    together are more than a few); a step run alone takes its program where it has few rows.
    A decoder compiled whole steps alone."""
    from onmt_lite.models import aot
    monkeypatch.setattr(aot, "aot_compiler", lambda *_: lambda program, *_: program)
    hybrid = build_translator({"model": MODEL, "beam_size": 2, "int8": True, "compile": True})
    whole = build_translator({"model": MODEL, "beam_size": 2, "compile": True})
    assert hybrid.model.decoder.compiled_step.few_rows_only
    with inference():
        assert shared_step._together("step", hybrid.model.decoder) == (
            "fast_step", id(hybrid.model.decoder.layers))
        assert shared_step._together("step", whole.model.decoder) is None
    rows = []
    joined = shared_step._fast_steps
    monkeypatch.setattr(shared_step, "_fast_steps",
                        lambda requests: rows.append(len(requests)) or joined(requests))
    got = _joined_at_steps(hybrid, [DEMO[:3], DEMO[3:4], DEMO[4:] + DEMO[:2]], [0, 2, 4])
    assert max(rows) == 3 and all(len(t.preds[0]) > 0 for batch in got for t in batch)
