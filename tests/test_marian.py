"""Hugging Face Marian directories: greedy output and scores identical to transformers'
``generate``, tokenizer parity, generation defaults, convert, and clear errors."""
import json
import logging
import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT
from marian_dirs import SOURCES, generate, run_generate, write_marian

from onmt_lite.checkpoint import CheckpointError, load_checkpoint
from onmt_lite.cli import convert as convert_cli
from onmt_lite.translate import build_translator

transformers = pytest.importorskip("transformers", reason="transformers is the oracle here "
                                                          "(pip install -e '.[test]')")

VARIANTS = {  # name -> write_marian arguments
    "opus": {},
    "gelu, no embedding scale, bin weights": dict(activation_function="gelu",
                                                  scale_embedding=False, bin_weights=True),
    "relu, untied output layer": dict(activation_function="relu", tie_word_embeddings=False,
                                      seed=3),
    "separate vocabularies": dict(separate=True, seed=4),
    "no generation_config.json": dict(generation=None, seed=5),
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def marian_dir(request, tmp_path_factory):
    return write_marian(tmp_path_factory.mktemp("marian"), **VARIANTS[request.param])


@pytest.fixture(scope="module")
def opus_dir(tmp_path_factory):
    return write_marian(tmp_path_factory.mktemp("opus"))


def ours(folder, sources=SOURCES, **options):
    translator = build_translator({"model": folder, "beam_size": 1, **options})
    return translator.translate(sources, batch_size=len(sources)), translator


def test_greedy_output_and_scores_are_generates(marian_dir):
    results, translator = ours(marian_dir)
    # the directory's max_length where it has one; else onmt_lite's, capped by the positions
    tokens, scores, texts = generate(marian_dir, SOURCES, num_beams=1,
                                     max_length=translator.opt.max_length + 1)
    eos = translator.tgt_vocab.specials["eos"]
    for result, their_tokens, score, text in zip(results, tokens, scores, texts):
        mine = result.preds[0] + ([eos] if their_tokens[-1] == eos else [])
        assert mine == their_tokens
        assert result.texts[0] == text
        assert result.scores[0] == pytest.approx(score, abs=2e-4)


def test_source_pieces_are_the_tokenizers(marian_dir):
    from transformers import MarianTokenizer
    tokenizer = MarianTokenizer.from_pretrained(marian_dir)
    results, translator = ours(marian_dir, max_length=2)
    for line, result in zip(SOURCES, results):
        assert translator.src_vocab.encode(result.src) == tokenizer(line).input_ids


def test_generation_defaults_apply_where_the_user_gave_none(opus_dir, caplog):
    with caplog.at_level(logging.INFO, logger="onmt_lite"):
        translator = build_translator({"model": opus_dir})
    assert translator.opt.beam_size == 4 and translator.opt.max_length == 23
    assert translator.opt.forced_eos and translator.opt.max_length_ratio == 0
    assert ("generation defaults apply: -max_length 23, -beam_size 4, never generating <pad>, "
            "</s> forced at -max_length") in caplog.text
    assert list(translator.opt.banned_tokens) == [translator.tgt_vocab.pad]
    given = build_translator({"model": opus_dir, "beam_size": 2, "max_length": 7})
    assert given.opt.beam_size == 2 and given.opt.max_length == 7


def test_command_line_options_win_over_the_models(opus_dir, tmp_path):
    src = tmp_path / "src.txt"
    src.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    run = subprocess.run([sys.executable, os.path.join(ROOT, "translate.py"), "-model", opus_dir,
                          "-src", str(src), "-output", str(out), "-beam_size", "1",
                          "-max_length", "30"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "-max_length 23" not in run.stderr and "-beam_size 4" not in run.stderr
    assert "never generating <pad>" in run.stderr
    _, _, texts = generate(opus_dir, SOURCES, num_beams=1, max_length=31)
    assert out.read_text(encoding="utf-8").split("\n")[:-1] == texts


def test_beam_search_runs_with_the_models_beam_size(opus_dir):
    """No option given: the directory's num_beams (4), max_length, banned <pad> and forced </s>
    apply; under -search hf that is generate() with no argument: the same tokens, text and
    score (sequences_scores) on every line."""
    translator = build_translator({"model": opus_dir, "search": "hf"})
    assert (translator.opt.beam_size, translator.opt.n_best) == (4, 1)
    results = translator.translate(SOURCES, batch_size=len(SOURCES))
    tokenizer, model, out = run_generate(opus_dir, SOURCES)
    assert model.generation_config.num_beams == 4
    eos = model.generation_config.eos_token_id
    assert len(results) == len(out.sequences) == len(SOURCES)
    for line, result, seq, score in zip(SOURCES, results, out.sequences.tolist(),
                                        out.sequences_scores.tolist()):
        generated = seq[1:]
        ended = eos in generated
        generated = generated[:generated.index(eos) + 1] if ended else generated
        theirs = tokenizer.convert_ids_to_tokens(generated)
        assert result.preds[0] + ["</s>"] * ended == theirs, line
        assert result.texts[0] == tokenizer.decode(seq, skip_special_tokens=True), line
        assert result.scores[0] == pytest.approx(score, abs=1e-4), line
        assert len(result.preds) == 1 and "<pad>" not in result.preds[0]
    # OpenNMT-py's rules, the default search, take the same beam from the directory
    default = build_translator({"model": opus_dir})
    assert (default.opt.beam_size, default.opt.max_length) == (4, translator.opt.max_length)


def test_both_beam_engines_force_the_end_at_the_limit(opus_dir):
    """Random models rarely end on their own: at -max_length </s> is the only choice."""
    runs = {}
    for engine in ("batch", "sentence"):
        results, translator = ours(opus_dir, beam_size=3, beam_engine=engine)
        runs[engine] = [(r.preds[0], round(r.scores[0], 4)) for r in results]
    assert runs["sentence"] == runs["batch"]
    assert any(len(pred) == translator.opt.max_length - 1 for pred, _ in runs["batch"])


def test_convert_writes_a_checkpoint_that_translates_identically(marian_dir, tmp_path):
    converted = str(tmp_path / "marian.pt")
    assert convert_cli.main(["-model", marian_dir, "-output", converted]) == 0
    ckpt = load_checkpoint(converted)
    assert ckpt.tokenizer["kind"] == "marian" and ckpt.generation == load_checkpoint(
        marian_dir).generation
    for beam_size in (1, 3):
        before, _ = ours(marian_dir, beam_size=beam_size)
        after, _ = ours(converted, beam_size=beam_size)
        assert [r.texts for r in after] == [r.texts for r in before]
        assert [r.scores for r in after] == [r.scores for r in before]


def test_pad_token_is_never_generated_even_where_it_is_likeliest(tmp_path):
    folder = write_marian(tmp_path / "m", pad_bias=50.0)
    tokens, scores, _ = generate(folder, SOURCES[:3], num_beams=1)
    results, _ = ours(folder, SOURCES[:3])
    for result, their_tokens, score in zip(results, tokens, scores):
        assert "<pad>" not in result.preds[0] and result.preds[0] == their_tokens[:-1]
        assert result.scores[0] == pytest.approx(score, abs=2e-4)


# -- bad input ----------------------------------------------------------------------------
def broken(opus_dir, tmp_path, change):
    folder = tmp_path / "broken"
    shutil.copytree(opus_dir, folder)
    change(folder)
    return str(folder)


def edit_json(name, **values):
    def change(folder):
        path = folder / name
        data = json.loads(path.read_text())
        data.update(values)
        path.write_text(json.dumps(data))
    return change


@pytest.mark.parametrize("change, message", [
    (lambda f: (f / "source.spm").unlink(), "source.spm: missing"),
    (lambda f: (f / "vocab.json").unlink(), "vocab.json: missing"),
    (lambda f: (f / "model.safetensors").unlink(), "model.safetensors: missing (nor "
                                                   "pytorch_model.bin)"),
    (lambda f: (f / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}"),
     "model.safetensors: unreadable weights"),
    (lambda f: (f / "target.spm").write_text("not a model"), "target.spm: not a sentencepiece"),
    (lambda f: (f / "config.json").write_text("{not json"), "config.json: not valid JSON"),
    (lambda f: shutil.copy(os.path.join(ROOT, "data", "multi30k_en_de.spm"), f / "source.spm"),
     "source.spm: does not fit the model's vocabulary"),
    (edit_json("config.json", model_type="bart"), "model_type 'bart'"),
    (edit_json("config.json", activation_function="mish"), "activation_function 'mish'"),
    (edit_json("config.json", decoder_attention_heads=2), "encoder_attention_heads 4 differs"),
    (edit_json("vocab.json", extra=999), "vocab.json: token ids are not 0 to"),
    (edit_json("vocab.json", extra=None), "vocab.json: token ids are not"),
    (edit_json("generation_config.json", no_repeat_ngram_size=3),
     "no_repeat_ngram_size=3 needs -search hf"),
    (edit_json("generation_config.json", do_sample=True), "do_sample=True is not supported"),
    (edit_json("generation_config.json", bad_words_ids=[[5, 6]]), "bad_words_ids of several"),
])
def test_a_broken_directory_is_one_clear_line_and_no_output(opus_dir, tmp_path, change,
                                                              message):
    folder = broken(opus_dir, tmp_path, change)
    src = tmp_path / "src.txt"
    src.write_text("a man\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    run = subprocess.run([sys.executable, os.path.join(ROOT, "translate.py"), "-model", folder,
                          "-src", str(src), "-output", str(out)], capture_output=True, text=True)
    assert run.returncode == 1
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], run.stderr
    assert not out.exists()


def test_vocabulary_that_does_not_fit_the_embeddings(opus_dir, tmp_path):
    def grow(folder):
        path = folder / "vocab.json"
        data = json.loads(path.read_text())
        data["extra"] = len(data)
        path.write_text(json.dumps(data))
    folder = broken(opus_dir, tmp_path, grow)
    with pytest.raises(CheckpointError, match=r"vocab.json: has \d+ tokens, the model's "
                                              r"embeddings \d+"):
        load_checkpoint(folder)


def test_transforms_do_not_apply_to_a_marian_model(opus_dir):
    from onmt_lite.transforms import TransformError
    with pytest.raises(TransformError, match="brings its own tokenizer"):
        build_translator({"model": opus_dir, "transforms": ["sentencepiece"]})


def test_only_generate_and_opennmt_rules_force_the_end_at_the_limit(tmp_path):
    """forced_eos_token_id is generate()'s: under -search tf a hypothesis that never ends comes
    back with all -max_length tokens, as TensorFlow's search returns it, and under -search
    fairseq with </s> after them (fairseq's own rule); hf and onmt end on the forced </s>."""
    folder = write_marian(tmp_path / "m", eos_bias=-50.0)  # never ends by itself
    lengths = {}
    for search in ("tf", "fairseq", "hf", "onmt"):
        translator = build_translator({"model": folder, "search": search, "beam_size": 3,
                                       "max_length": 40})
        lengths[search] = len(translator.translate(["a b c"])[0].preds[0])
    assert lengths == {"tf": 40, "fairseq": 40, "hf": 39, "onmt": 39}
