"""OpenNMT-py's decoding features beyond the fixtures' cases give OpenNMT-py 3.5.1's own output,
word for word, with the same command-line options: -ban_unk_token, -ratio (with OpenNMT-py's way
of reading the source length), -tgt_file_prefix, ensembles (-model a b, -avg_raw_probs).

The reference (tests/reference/onmt_py.json) is onmt_translate's output, made by
tests/reference/make_onmt_py.py in a side environment; models and data come from ../shared.
"""
import json
import os

import pytest
from conftest import ROOT, SHARED_FIXTURES
from reference.onmt_py_variant import write_variant

from onmt_lite.cli import translate as translate_cli

DATA = os.path.join(ROOT, "..", "shared", "data", "multi30k")
REFERENCE = os.path.join(ROOT, "tests", "reference", "onmt_py.json")
pytestmark = pytest.mark.skipif(
    not (os.path.exists(os.path.join(SHARED_FIXTURES, "rnn.pt"))
         and os.path.exists(os.path.join(DATA, "test_2016_flickr.lc.tok.de"))),
    reason="needs ../shared (the OpenNMT-py fixtures, Multi30k)")

with open(REFERENCE, encoding="utf-8") as f:
    REF = json.load(f)


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


def test_an_ensemble_may_join_a_transformer_and_an_rnn(inputs, tmp_path):
    """OpenNMT-py 3.5.1 crashes on this ensemble (its attention shapes differ); here each model
    keeps its own state and the mean attention has one layout."""
    output = tmp_path / "pred.txt"
    models = [os.path.join(SHARED_FIXTURES, m) for m in ("transformer.pt", "rnn.pt")]
    assert translate_cli.main(["-model", *models, "-src", str(inputs["en"]), "-output",
                               str(output), "-beam_size", "3", "-no_progress"]) == 0
    lines = output.read_text(encoding="utf-8").splitlines()
    assert len(lines) == REF["lines"] and all(lines)


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
