"""OpenNMT-py's decoding features beyond the fixtures' cases give OpenNMT-py 3.5.1's own output,
word for word, with the same command-line options: -ban_unk_token, -ratio (with OpenNMT-py's way
of reading the source length), -tgt_file_prefix, ensembles (-model a b, -avg_raw_probs); and the
fixtures made to misbehave (a model that never ends, one that ends at once) at their limits.

The references (tests/reference/onmt_py.json, onmt_py_edges.json) are onmt_translate's output,
made by tests/reference/make_onmt_py.py and make_onmt_py_edges.py in a side environment; models
and data come from ../shared.
"""
import json
import os

import pytest
import torch
from conftest import ROOT, SHARED_FIXTURES
from reference.edge_variant import EOS_SHIFTS, write_edge_variant
from reference.onmt_py_variant import write_variant

from onmt_lite.checkpoint import load_model
from onmt_lite.cli import translate as translate_cli

DATA = os.path.join(ROOT, "..", "shared", "data", "multi30k")
REFERENCE = os.path.join(ROOT, "tests", "reference", "onmt_py.json")
pytestmark = pytest.mark.skipif(
    not (os.path.exists(os.path.join(SHARED_FIXTURES, "rnn.pt"))
         and os.path.exists(os.path.join(DATA, "test_2016_flickr.lc.tok.de"))),
    reason="needs ../shared (the OpenNMT-py fixtures, Multi30k)")

with open(REFERENCE, encoding="utf-8") as f:
    REF = json.load(f)
ENSEMBLE_LINES = 20  # the lines of the Transformer-RNN ensemble, its search written out again


@pytest.fixture(scope="module")
def variant(tmp_path_factory):
    path = tmp_path_factory.mktemp("variant") / "variant.pt"
    write_variant(os.path.join(SHARED_FIXTURES, "transformer.pt"), str(path))
    return str(path)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """The first lines of the source, and the first words of each reference (the prefixes)."""
    folder = tmp_path_factory.mktemp("inputs")
    paths = {}
    for side, words in (("en", None), ("de", REF["prefix_words"])):
        with open(os.path.join(DATA, f"test_2016_flickr.lc.tok.{side}"), encoding="utf-8") as f:
            lines = [" ".join(next(f).split()[:words]) for _ in range(REF["lines"])]
        paths[side] = folder / f"input.{side}"
        paths[side].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return paths


@pytest.mark.parametrize("case", list(REF["cases"]))
def test_output_is_onmt_pys(case, inputs, variant, tmp_path):
    spec = REF["cases"][case]
    output = tmp_path / "pred.txt"
    models = [variant if m == "variant.pt" else os.path.join(SHARED_FIXTURES, m)
              for m in spec["models"]]
    extra = ["-tgt", str(inputs["de"])] if "-tgt_file_prefix" in spec["options"] else []
    code = translate_cli.main(["-model", *models, "-src", str(inputs["en"]), "-output",
                               str(output), "-beam_size", "5", "-no_progress", *extra,
                               *spec["options"]])
    assert code == 0
    assert output.read_text(encoding="utf-8").splitlines() == spec["output"]


def test_phrase_table_translates_the_replaced_words(inputs, tmp_path):
    """-replace_unk copies the most attended source word; -phrase_table then gives its entry,
    read as OpenNMT-py reads it: the last line starting with the word."""
    args = ["-model", os.path.join(SHARED_FIXTURES, "transformer.pt"), "-src",
            str(inputs["en"]), "-beam_size", "5", "-no_progress"]

    def run(*extra):
        output = tmp_path / "pred.txt"
        assert translate_cli.main(args + ["-output", str(output), *extra]) == 0
        return [line.split() for line in output.read_text(encoding="utf-8").splitlines()]

    with_unk, copied = run(), run("-replace_unk")
    replaced = {(n, i): copied[n][i] for n, line in enumerate(with_unk)
                for i, word in enumerate(line) if word == "<unk>"}
    assert replaced, "no <unk> in the output: the test needs one"
    table = tmp_path / "phrases.txt"
    table.write_text("".join(f"{w}|||first-{w}\n{w}|||[{w}]\n"
                             for w in sorted(set(replaced.values()))), encoding="utf-8")
    expected = [[f"[{w}]" if (n, i) in replaced else w for i, w in enumerate(line)]
                for n, line in enumerate(copied)]
    assert run("-replace_unk", "-phrase_table", str(table)) == expected


def test_a_phrase_table_line_without_separator_is_named(inputs, tmp_path, capsys):
    table = tmp_path / "phrases.txt"
    table.write_text("dog|||Hund\ncat Katze\n", encoding="utf-8")
    code = translate_cli.main(["-model", os.path.join(SHARED_FIXTURES, "transformer.pt"),
                               "-src", str(inputs["en"]), "-output", str(tmp_path / "o.txt"),
                               "-replace_unk", "-phrase_table", str(table)])
    assert code == 1
    assert f"{table}: line 2: expected 'source|||target'" in capsys.readouterr().err
    assert not (tmp_path / "o.txt").exists()


def ensemble_greedy(models, words):
    """Greedy search written out for an ensemble of (model, checkpoint) pairs, without the
    search loop or the decoder's step state: at each step every model decodes the whole prefix
    again, and the next token is the best of the log-softmax of the mean of their logits
    (OpenNMT-py's ensemble); the length limit is OpenNMT-py's for a batch of one line.
    -> (tokens, score): the summed log-probabilities divided, as OpenNMT-py's greedy search does
    with -length_penalty avg, by the length of the hypothesis with <s> (and </s> if it ended)."""
    src_vocab, tgt_vocab = models[0][1].src_vocab, models[0][1].tgt_vocab
    src = torch.tensor([src_vocab.encode(words)])
    src_len = torch.tensor([len(words)])
    prefix, score, steps = [tgt_vocab.bos], 0.0, 0
    with torch.no_grad():
        for steps in range(1, int(min(250, len(words) * 1.25 + 5)) + 1):
            logits = []
            for model, _ in models:
                memory, final = model.encode(src, src_len)
                model.decoder.init_state(src_len, memory, final)
                out, _ = model.decoder(torch.tensor([prefix]))
                logits.append(model.generator(out[0, -1]).float())
            log_probs = torch.log_softmax(torch.stack(logits).mean(0), dim=-1)
            token = int(log_probs.argmax())
            score += float(log_probs[token])
            if token == tgt_vocab.eos:
                break
            prefix.append(token)
    return tgt_vocab.decode(prefix[1:]), score / (steps + 1)


def test_an_ensemble_may_join_a_transformer_and_an_rnn(inputs, tmp_path):
    """OpenNMT-py 3.5.1 crashes on this ensemble (its attention shapes differ); here each model
    keeps its own state, and greedy search gives, with its score, the best token of the
    log-softmax of the mean of the two models' logits at each step."""
    sources = inputs["en"].read_text(encoding="utf-8").splitlines()[:ENSEMBLE_LINES]
    src, output = tmp_path / "src.en", tmp_path / "pred.txt"
    src.write_text("".join(line + "\n" for line in sources), encoding="utf-8")
    models = [os.path.join(SHARED_FIXTURES, m) for m in ("transformer.pt", "rnn.pt")]
    assert translate_cli.main(["-model", *models, "-src", str(src), "-output", str(output),
                               "-beam_size", "1", "-batch_size", "1", "-with_score",
                               "-no_progress"]) == 0
    written = [line.split("\t") for line in output.read_text(encoding="utf-8").splitlines()]
    assert len(written) == len(sources)
    loaded = [load_model(model) for model in models]
    for number, (source, (text, score)) in enumerate(zip(sources, written), 1):
        tokens, expected = ensemble_greedy(loaded, source.split())
        assert text == " ".join(tokens), number
        assert float(score) == pytest.approx(expected, abs=1e-4), number


def test_bad_decoding_requests_are_one_clear_line(inputs, tmp_path, capsys):
    model = os.path.join(SHARED_FIXTURES, "transformer.pt")
    other = os.path.join(ROOT, "..", "shared", "fixtures", "onmt-py-spm", "model.pt")
    output = tmp_path / "pred.txt"
    base = ["-src", str(inputs["en"]), "-output", str(output), "-no_progress"]
    assert translate_cli.main(["-model", model, *base, "-tgt_file_prefix"]) != 0
    assert "-tgt_file_prefix forces the -tgt lines: give -tgt" in capsys.readouterr().err
    if os.path.exists(other):
        assert translate_cli.main(["-model", model, other, *base]) != 0
        assert "its vocabularies differ" in capsys.readouterr().err
    assert not output.exists()


with open(os.path.join(ROOT, "tests", "reference", "onmt_py_edges.json"), encoding="utf-8") as f:
    EDGES = json.load(f)


@pytest.mark.parametrize("fixture", ["transformer.pt", "rnn.pt"])
@pytest.mark.parametrize("shift", list(EOS_SHIFTS))
def test_models_that_misbehave_give_opennmt_pys_output_at_the_limits(fixture, shift, tmp_path):
    """Every hypothesis meets -max_length (or the limit from the source length), or </s> comes
    first wherever -min_length allows: each setting's lines, n-best included, as onmt_translate
    writes them."""
    model, src = tmp_path / "model.pt", tmp_path / "src.en"
    write_edge_variant(os.path.join(SHARED_FIXTURES, fixture), str(model), shift)
    with open(os.path.join(DATA, "test_2016_flickr.lc.tok.en"), encoding="utf-8") as f:
        src.write_text("".join(next(f) for _ in range(EDGES["lines"])), encoding="utf-8")
    for name, options in EDGES["cases"].items():
        out = tmp_path / "out.txt"
        assert translate_cli.main(["-model", str(model), "-src", str(src), "-output", str(out),
                                   "-no_progress", *options]) == 0
        assert out.read_text(encoding="utf-8").splitlines() == \
            EDGES["outputs"][f"{fixture} {shift}, {name}"], name
