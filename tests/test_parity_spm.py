"""Raw text through OpenNMT-py 3.5.1's sentencepiece transform: onmt_lite's output lines and
scores against that toolkit's own, on its raw-Multi30k fixture (../shared/fixtures/onmt-py-spm),
whole files, and the transform's set-up errors."""
import os
import re

import pytest
import torch

from onmt_lite.transforms import SentencePieceTransform, TransformError, build_transform
from onmt_lite.translate.build import build_translator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "..", "shared", "fixtures", "onmt-py-spm")
MODEL = os.path.join(FIXTURE, "model.pt")
SPM = os.path.join(FIXTURE, "spm.model")
REFS = os.path.join(FIXTURE, "refs", "test_2016_flickr")
SRC = os.path.join(ROOT, "..", "shared", "data", "multi30k", "test_2016_flickr.en")

pytestmark = pytest.mark.skipif(not (os.path.isfile(MODEL) and os.path.isfile(SRC)),
                                reason="../shared/fixtures/onmt-py-spm is absent")
_translators: dict = {}


def translations(beam_size: int, n_best: int = 1, transforms=("sentencepiece",)):
    """The whole test file translated as the fixture's translate.yaml does (batch 32)."""
    key = (beam_size, n_best, transforms)
    if key not in _translators:
        translator = build_translator({
            "model": MODEL, "beam_size": beam_size, "n_best": n_best, "inter_threads": 2,
            "transforms": list(transforms), "src_subword_model": SPM, "tgt_subword_model": SPM})
        _translators[key] = translator.translate(SRC, batch_size=32)
    return _translators[key]


def reference(name: str) -> list:
    with open(os.path.join(REFS, f"model.{name}.txt"), encoding="utf-8") as f:
        return f.read().split("\n")[:-1]


@pytest.mark.parametrize("case, beam_size", [("greedy", 1), ("beam5", 5)])
def test_raw_text_output_equals_opennmt_py(case, beam_size):
    ours = [line for t in translations(beam_size) for line in t.output_lines()]
    theirs = reference(case)
    assert len(ours) == len(theirs) == 1000
    differ = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    assert differ == [], f"lines differing from OpenNMT-py: {differ[:10]}"


def test_n_best_lines_and_scores_equal_opennmt_py():
    results = translations(5, n_best=3)
    ours = [line for t in results for line in t.output_lines()]
    assert ours == reference("nbest3_noscore")
    with open(os.path.join(REFS, "model.nbest3_noscore.log"), encoding="utf-8") as f:
        log = f.read()
    blocks = log.split("\nSENT ")[1:]
    assert len(blocks) == 1000
    for t, block in zip(results, blocks):
        pieces = re.search(r"^\d+: (\[.*\])$", block, re.M).group(1)
        assert pieces == str(t.src_vocab)  # -verbose shows the source pieces
        best = [float(x) for x in re.findall(r"^\[(-?[\d.]+)\] ", block, re.M)]
        assert len(best) == 3 and all(abs(a - b) <= 1.5e-4 for a, b in zip(t.scores, best))


def test_without_transforms_the_pieces_come_out_as_opennmt_py_writes_them():
    ours = [line for t in translations(5, transforms=()) for line in t.output_lines()]
    assert ours == reference("no_transforms")


def test_the_checkpoint_transforms_apply_when_none_are_given(caplog):
    with caplog.at_level("INFO", logger="onmt_lite"):
        translator = build_translator({"model": MODEL, "beam_size": 5})
    assert "applying the checkpoint's transforms ['sentencepiece', 'filtertoolong']" \
        in caplog.text
    first = translator.translate(["A man in an orange hat starring at something."])[0]
    assert first.src_vocab == translations(5)[0].src_vocab  # the same pieces
    assert first.src_vocab[0] == "\u2581A" and first.texts[0].startswith("Ein Mann")


def options(**given):
    return given.get


def test_transform_set_up_errors_name_the_file_and_option(tmp_path):
    with pytest.raises(TransformError, match="-transforms sentencepiece needs -tgt_subword_model"):
        build_transform(options(transforms=["sentencepiece"], src_subword_model=SPM), {}, MODEL)
    missing = str(tmp_path / "gone.model")
    with pytest.raises(TransformError, match=re.escape(
            f"{missing}: no such sentencepiece model (given by -src_subword_model)")):
        build_transform(options(transforms=["sentencepiece"], src_subword_model=missing,
                                tgt_subword_model=SPM), {}, MODEL)
    text = tmp_path / "text.model"
    text.write_text("not a model\n")
    with pytest.raises(TransformError, match="text.model: not a sentencepiece model"):
        SentencePieceTransform(str(text), SPM)
    with pytest.raises(TransformError, match="^-transforms bpe needs -src_subword_model$"):
        build_transform(options(transforms=["bpe"]), {}, MODEL)
    # a checkpoint naming a subword model that is not there
    opt = {"transforms": ["sentencepiece"], "src_subword_model": "absent.model",
           "tgt_subword_model": "absent.model"}
    with pytest.raises(TransformError, match="absent.model: no such sentencepiece model"):
        build_transform(options(), opt, str(tmp_path / "model.pt"))


def test_command_line_with_a_yaml_config_and_a_missing_subword_model(tmp_path, capsys):
    from onmt_lite.cli import translate as translate_cli
    config = tmp_path / "translate.yaml"
    config.write_text(f"model: {MODEL}\ntransforms: [sentencepiece]\n"
                      f"src_subword_model: {SPM}\ntgt_subword_model: {SPM}\nbatch_size: 32\n")
    src, out = tmp_path / "in.en", tmp_path / "out.de"
    src.write_text("A man in an orange hat starring at something.\n\n   \n")
    assert translate_cli.main(["-config", str(config), "-src", str(src), "-output", str(out)]) == 0
    lines = out.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(lines) == 3 and lines[0].startswith("Ein Mann") and lines[1:] == ["", ""]
    capsys.readouterr()
    assert translate_cli.main(["-config", str(config), "-src", str(src), "-output", str(out),
                               "-tgt_subword_model", str(tmp_path / "none.model")]) == 1
    err = capsys.readouterr().err
    assert err == (f"translate.py: error: {tmp_path / 'none.model'}: no such sentencepiece model "
                   "(given by -tgt_subword_model)\n")
    assert out.read_text(encoding="utf-8").startswith("Ein Mann")  # the old output stays


def test_a_subword_model_that_does_not_fit_the_vocabulary_is_refused(tmp_path):
    """The shipped sentencepiece model with the shipped word-level model: wrong pairing."""
    import subprocess
    import sys
    spm = os.path.join(ROOT, "data", "multi30k_en_de.spm")
    src = tmp_path / "src.txt"
    src.write_text("A man rides a bike.\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    run = subprocess.run([sys.executable, os.path.join(ROOT, "translate.py"), "-model",
                          os.path.join(ROOT, "data", "multi30k_en_de.pt"), "-src", str(src),
                          "-output", str(out), "-transforms", "sentencepiece",
                          "-src_subword_model", spm, "-tgt_subword_model", spm],
                         capture_output=True, text=True)
    assert run.returncode == 1 and not out.exists()
    assert run.stderr.strip().count("\n") == 0, run.stderr
    assert re.search(r"multi30k_en_de.spm: does not fit the model's vocabulary: \d+ of its "
                     r"\d+ pieces are in it \(wrong -src_subword_model\?\)", run.stderr)


# OpenNMT-py 3.5.1's output for a line outside the test set, alone and as line 41 of 81 in a
# batch of 32, where its n-best stop ends the search (the top beam finished with three finished
# hypotheses, two of them shorter than better-scored ones a longer search would find):
#   onmt_translate -config translate.yaml -src windsurf.en -beam_size 5 -n_best 3 -verbose
WINDSURF = "Someone is windsurfing in the ocean."
WINDSURF_NBEST = [("Ein Mann in einem Neoprenanzug surft im Meer.", -0.7256),
                  ("Ein Mann springt in die Luft.", -0.7957),
                  ("Ein Mann in der Nähe eines Boots.", -0.8535)]


def boundary_gaps(translator, lines, batch_size: int) -> dict:
    """{line: the smallest gap, over its own search in the batches translate() makes, between
    the last candidate a step keeps and the first it drops} (hunt_search.LineGaps)."""
    import sys
    sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
    from hunt_search import LineGaps

    from onmt_lite.search import presets
    from onmt_lite.search.candidates import TopK
    recorder = LineGaps()

    class Measured(TopK):
        def pick(self, scores, k):
            edge = scores.reshape(scores.size(0), -1).topk(k + 1, dim=1).values
            recorder.record(edge, k - 1)
            return super().pick(scores, k)

    real, presets.TopK = presets.TopK, Measured
    try:
        with recorder:
            translator.translate(lines, batch_size=batch_size)
    finally:
        presets.TopK = real
    return recorder.gaps


def test_the_n_best_stop_is_opennmt_pys_alone_and_in_a_batch():
    # one torch thread, as the default layout decodes a lone sentence: on an AVX-512 CPU, MKL's
    # two-thread products of a one-sentence batch round this line's near-tie the other way
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        translator = build_translator({"model": MODEL, "beam_size": 5, "n_best": 3})
        with open(SRC, encoding="utf-8") as f:
            lines = [next(f).rstrip("\n") for _ in range(80)]
        for batch, at in (([WINDSURF], 0), (lines[:40] + [WINDSURF] + lines[40:], 40)):
            result = translator.translate(batch, batch_size=32)[at]
            nbest = [(text, round(score, 4)) for text, score in zip(result.texts, result.scores)]
            if at and nbest != WINDSURF_NBEST:
                # the other side of its step-6 tie (two candidates < 1e-6 apart), which a batch's
                # float sums may round either way, in OpenNMT-py too (test_parity_batchmates.py):
                # on an Intel Xeon with AVX-512, here; measured on its own rows of this batch
                assert nbest[0] == WINDSURF_NBEST[0]
                assert boundary_gaps(translator, batch, 32)[at] < 1e-5
            else:
                assert nbest == WINDSURF_NBEST
    finally:
        torch.set_num_threads(threads)
