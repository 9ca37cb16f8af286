"""translate.py -split_sentences: each line a paragraph, its sentences (cut as LibreTranslate
cuts them) translated as the translator translates them alone and joined by a space; one
output line per input line, empty ones kept; the options it cannot serve refused."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("spacy", reason="-split_sentences needs spaCy (sentences extra)")

from onmt_lite.errors import OptionError  # noqa: E402
from onmt_lite.translate.build import build_translator  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "data", "multi30k_en_de_raw.pt")
LINES = ["A man rides a bike. A dog runs in the park.", "", "Dr. Smith is talking to a woman.",
         "  ", "Two women are talking! A boy laughs? The end."]
SENTENCES = [["A man rides a bike.", "A dog runs in the park."], [],
             ["Dr. Smith is talking to a woman."], ["  "],
             ["Two women are talking!", "A boy laughs?", "The end."]]


@pytest.fixture(scope="module")
def alone():
    """Each sentence's 2-best, translated without splitting."""
    translator = build_translator({"model": MODEL, "n_best": 2, "beam_size": 3})
    flat = [s for sentences in SENTENCES for s in sentences]
    return dict(zip(flat, translator.translate(flat)))


def test_each_line_is_its_sentences_translations_joined(alone):
    translator = build_translator({"model": MODEL, "n_best": 2, "beam_size": 3,
                                   "split_sentences": "en"})
    results = translator.translate(LINES, shard_size=2)  # paragraphs across shards
    assert [t.index for t in results] == list(range(len(LINES)))
    for t, sentences in zip(results, SENTENCES):
        for k in range(2):
            parts = [alone[s].texts[k] for s in sentences]
            assert t.texts[k] == " ".join(p for p in parts if p)
            assert t.scores[k] == pytest.approx(sum(alone[s].scores[k] for s in sentences))
            assert t.preds[k] == [tok for s in sentences for tok in alone[s].preds[k]]
        width = sum(len(alone[s].src_vocab) for s in sentences)
        assert t.attns[0].shape[1] == width  # a block per sentence
    assert results[1].texts == ["", ""] and results[1].scores == [0.0, 0.0]


def test_translate_py_writes_one_line_per_input_line(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    subprocess.run([sys.executable, "translate.py", "-model", MODEL, "-src", str(src), "-output",
                    str(out), "-split_sentences", "en", "-n_best", "2", "-beam_size", "3"],
                   cwd=ROOT, check=True, capture_output=True)
    lines = out.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(lines) == 2 * len(LINES) and lines[2:4] == ["", ""]


def test_what_it_cannot_serve_is_refused(tmp_path):
    translator = build_translator({"model": MODEL, "split_sentences": "en"})
    with pytest.raises(OptionError, match="-tgt"):
        list(translator.translate_iter(LINES, LINES))
    with pytest.raises(OptionError, match="-resume"):
        translator.numbered_batches(LINES)
