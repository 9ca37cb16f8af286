"""BLEU/chrF scoring through sacrebleu, and the onmt_lite_evaluate command."""
import json
import math

import pytest
import sacrebleu

from onmt_lite.cli.evaluate import main
from onmt_lite.corpus import InputError
from onmt_lite.evaluate import corpus_scores, evaluate_files

VERSION = sacrebleu.__version__


def write_lines(path, lines) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def run(capsys, *argv):
    """Runs the command; returns (exit status, stdout, stderr)."""
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def bleu_of(scores):
    return next(s for s in scores if s.metric == "BLEU")


# -- the library ---------------------------------------------------------------------------
def test_identical_text_scores_100():
    lines = ["a man rides a bike .", "two dogs play in the snow ."]
    scores = corpus_scores(lines, [lines])
    assert [s.metric for s in scores] == ["BLEU", "chrF"]
    assert all(s.score == pytest.approx(100.0) for s in scores)


def test_bleu_checked_by_hand():
    # hyp "the cat sat on the mat", ref "the cat is on the mat" (6 tokens each, BP = 1):
    #   1-grams 5/6 (all but "sat"), 2-grams 3/5 ("the cat", "on the", "the mat"),
    #   3-grams 1/4 ("on the mat"), 4-grams 0/3 -> sacrebleu's "exp" smoothing: 1/(2*3)
    #   BLEU = (5/6 * 3/5 * 1/4 * 1/6) ** (1/4) = (1/48) ** 0.25 = 0.37992
    score = bleu_of(corpus_scores(["the cat sat on the mat"], [["the cat is on the mat"]]))
    assert score.score == pytest.approx(100 * (1 / 48) ** 0.25)
    assert score.score == pytest.approx(37.9918, abs=1e-4)
    assert score.text.startswith("BLEU = 37.99 83.3/60.0/25.0/16.7 (BP = 1.000")


def test_brevity_penalty_checked_by_hand():
    # hyp "the cat sat on the" (5 tokens) against "the cat sat on the mat" (6):
    #   every n-gram matches (5/5, 4/4, 3/3, 2/2); BP = exp(1 - 6/5) = exp(-0.2) = 0.81873
    score = bleu_of(corpus_scores(["the cat sat on the"], [["the cat sat on the mat"]]))
    assert score.score == pytest.approx(100 * math.exp(-0.2))
    assert "BP = 0.819" in score.text


def test_agrees_with_sacrebleu_called_directly():
    hyps = ["a man in a blue shirt is running .", "Two dogs play, in the snow!", "a woman ."]
    refs = [["a man in a blue shirt runs .", "two dogs are playing in the snow .", "a lady ."],
            ["a man wearing blue runs .", "Two dogs play in snow!", "a woman sits ."]]
    for tokenize in ("13a", "none", "intl"):
        for lowercase in (False, True):
            expected = sacrebleu.corpus_bleu(hyps, refs, tokenize=tokenize, lowercase=lowercase)
            chrf = sacrebleu.CHRF(lowercase=lowercase).corpus_score(hyps, refs)
            bleu, chrf_score = corpus_scores(hyps, refs, tokenize=tokenize, lowercase=lowercase)
            assert bleu.score == pytest.approx(expected.score, abs=1e-9)
            assert chrf_score.score == pytest.approx(chrf.score, abs=1e-9)
            assert bleu.text == str(expected)
            case = "lc" if lowercase else "mixed"
            assert bleu.signature == (f"nrefs:2|case:{case}|eff:no|tok:{tokenize}|smooth:exp|"
                                      f"version:{VERSION}")


def test_reference_of_another_length_is_refused():
    with pytest.raises(InputError, match="reference 2 has 1 lines but the hypotheses have 2"):
        corpus_scores(["a", "b"], [["a", "b"], ["a"]])


def test_metrics_selection():
    assert [s.metric for s in corpus_scores(["a b"], [["a b"]], metrics=("chrf",))] == ["chrF"]
    assert [s.metric for s in corpus_scores(["a b"], [["a b"]], metrics=("bleu",))] == ["BLEU"]


def test_evaluate_files_names_the_file_whose_length_differs(tmp_path):
    hyp = write_lines(tmp_path / "hyp.txt", ["a", "b"])
    ref = write_lines(tmp_path / "ref.txt", ["a", "b", "c"])
    with pytest.raises(InputError) as err:
        evaluate_files(hyp, [ref])
    assert str(err.value) == f"{ref}: has 3 lines but {hyp} has 2"


# -- the command ---------------------------------------------------------------------------
@pytest.fixture
def files(tmp_path):
    hyp = write_lines(tmp_path / "hyp.txt", ["the cat sat on the mat", "A man rides a bike."])
    ref = write_lines(tmp_path / "ref.txt", ["the cat is on the mat", "a man rides a bike ."])
    return hyp, ref


def test_cli_prints_the_sacrebleu_score_and_signature(files, capsys):
    hyp, ref = files
    status, out, err = run(capsys, "-hyp", hyp, "-ref", ref)
    assert status == 0 and err == ""
    hyps = ["the cat sat on the mat", "A man rides a bike."]
    refs = [["the cat is on the mat", "a man rides a bike ."]]
    bleu = sacrebleu.BLEU()
    expected = bleu.corpus_score(hyps, refs)
    chrf = sacrebleu.CHRF()
    expected_chrf = chrf.corpus_score(hyps, refs)
    assert out.splitlines() == [f"{expected}  ({bleu.get_signature()})",
                                f"{expected_chrf}  ({chrf.get_signature()})"]
    assert f"tok:13a|smooth:exp|version:{VERSION}" in out


def test_cli_identical_files_score_100(tmp_path, capsys):
    ref = write_lines(tmp_path / "ref.txt", ["a man rides a bike .", "two dogs ."])
    status, out, _ = run(capsys, "-hyp", ref, "-ref", ref, "-metrics", "bleu")
    assert status == 0
    assert out.startswith("BLEU = 100.00 100.0/100.0/100.0/100.0")


@pytest.mark.parametrize("options, fragment", [
    ([], "case:mixed|eff:no|tok:13a|"),
    (["-tokenize", "none"], "case:mixed|eff:no|tok:none|"),
    (["-tokenize", "intl"], "case:mixed|eff:no|tok:intl|"),
    (["-lowercase"], "case:lc|eff:no|tok:13a|"),
    (["--tokenize", "none", "--lowercase"], "case:lc|eff:no|tok:none|"),
])
def test_cli_options_change_the_signature(files, capsys, options, fragment):
    hyp, ref = files
    status, out, _ = run(capsys, "-hyp", hyp, "-ref", ref, "-metrics", "bleu", *options)
    assert status == 0
    assert f"(nrefs:1|{fragment}smooth:exp|version:{VERSION})" in out


def test_cli_tokenizer_and_case_change_the_score(tmp_path, capsys):
    # "bike." is one token without tokenization and two with 13a; "A" differs from "a" by case
    hyp = write_lines(tmp_path / "hyp.txt", ["A man rides a bike."])
    ref = write_lines(tmp_path / "ref.txt", ["a man rides a bike ."])

    def bleu(*options):
        status, out, _ = run(capsys, "-hyp", hyp, "-ref", ref, "-metrics", "bleu", "-json",
                             *options)
        assert status == 0
        return json.loads(out)["BLEU"]["score"]

    assert bleu("-lowercase") == 100.0  # 13a splits the final "."
    assert bleu("-lowercase", "-tokenize", "none") < 100.0
    assert bleu() < 100.0


def test_cli_json(files, capsys):
    hyp, ref = files
    status, out, _ = run(capsys, "-hyp", hyp, "-ref", ref, "-json", "-tokenize", "none")
    assert status == 0
    result = json.loads(out)
    assert set(result) == {"BLEU", "chrF"}
    hyps = ["the cat sat on the mat", "A man rides a bike."]
    refs = [["the cat is on the mat", "a man rides a bike ."]]
    expected = sacrebleu.corpus_bleu(hyps, refs, tokenize="none").score
    assert result["BLEU"]["score"] == round(expected, 2)
    assert result["BLEU"]["signature"] == f"nrefs:1|case:mixed|eff:no|tok:none|smooth:exp|" \
                                          f"version:{VERSION}"
    assert result["chrF"]["signature"].startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0|")


def test_cli_several_references(files, tmp_path, capsys):
    hyp, ref = files
    ref2 = write_lines(tmp_path / "ref2.txt", ["the cat sat on the mat", "a man rides a bike ."])
    status, out, _ = run(capsys, "-hyp", hyp, "-ref", ref, ref2, "-metrics", "bleu", "-json")
    assert status == 0
    assert json.loads(out)["BLEU"]["signature"].startswith("nrefs:2|")


def test_cli_line_count_mismatch(files, tmp_path, capsys):
    hyp, _ = files
    short = write_lines(tmp_path / "short.txt", ["the cat is on the mat"])
    status, out, err = run(capsys, "-hyp", hyp, "-ref", short)
    assert status == 1 and out == ""
    assert err == f"onmt_lite_evaluate: error: {short}: has 1 lines but {hyp} has 2\n"


def test_cli_missing_file(files, tmp_path, capsys):
    _, ref = files
    missing = str(tmp_path / "missing.txt")
    status, out, err = run(capsys, "-hyp", missing, "-ref", ref)
    assert status == 1 and out == ""
    assert err.startswith(f"onmt_lite_evaluate: error: {missing}: cannot read")


def test_cli_invalid_utf8(files, tmp_path, capsys):
    hyp, _ = files
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"the cat\nr\xe9f\n")
    status, _, err = run(capsys, "-hyp", hyp, "-ref", str(bad))
    assert status == 1
    assert f"{bad}:2: invalid UTF-8" in err


def test_cli_unknown_tokenizer_is_a_usage_error(files, capsys):
    hyp, ref = files
    with pytest.raises(SystemExit) as exit_info:
        main(["-hyp", hyp, "-ref", ref, "-tokenize", "zh"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'zh'" in capsys.readouterr().err


def test_cli_empty_files(tmp_path, capsys):
    """No lines: no score (sacrebleu itself fails with an IndexError), a one-line error."""
    empty = write_lines(tmp_path / "empty.txt", [])
    status, out, err = run(capsys, "-hyp", empty, "-ref", empty)
    assert (status, out) == (1, "")
    assert err == "onmt_lite_evaluate: error: the hypothesis file has no lines\n"
