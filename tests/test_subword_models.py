"""Subword models kept in checkpoints: training, averaging and onmt_lite_convert write them,
translation reads them (the checkpoint alone translates raw text; a model file given on the
command line wins); a model file that a checkpoint names and that cannot be found says where it
was looked for."""
import logging
import os
import shutil
import subprocess
import sys

import pytest
import sentencepiece
import torch
from conftest import ROOT, TINY_TRANSFORMER, make_model, toy_pairs
from test_checkpoint import write_onmt_py

from onmt_lite.checkpoint import load_checkpoint, save_checkpoint
from onmt_lite.cli import convert
from onmt_lite.constants import SPECIALS
from onmt_lite.train.trainer import average_checkpoints, train
from onmt_lite.transforms import build_transform, sentencepiece_pieces
from onmt_lite.translate.build import build_translator
from onmt_lite.vocab import Vocab

SHIPPED = os.path.join(ROOT, "data", "multi30k_en_de_raw.pt")
NAMES = ("src_subword_model", "tgt_subword_model")


def translate(*args, cwd):
    """translate.py as a user runs it."""
    return subprocess.run([sys.executable, os.path.join(ROOT, "translate.py"), *map(str, args)],
                          capture_output=True, text=True, cwd=cwd)


def make_spm(folder) -> str:
    """A joint sentencepiece model (40 pieces) of the toy task's words and their capitals."""
    corpus = os.path.join(folder, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write("".join(f"{src}\n{tgt}\n" for src, tgt in toy_pairs(400, 1)))
    sentencepiece.SentencePieceTrainer.train(
        input=corpus, model_prefix=os.path.join(folder, "p"), vocab_size=40,
        model_type="unigram", character_coverage=1.0, minloglevel=2)
    return os.path.join(folder, "p.model")


def pieces_checkpoint(path, spm: str, kept: bool = True, **named) -> None:
    """A seeded tiny Transformer over the pieces of ``spm`` whose options name the
    sentencepiece transform over ``spm`` (or the files ``named``), keeping it or not."""
    pieces = sentencepiece_pieces(sentencepiece.SentencePieceProcessor(model_file=spm))
    vocab = Vocab(list(SPECIALS) + pieces)
    opt = {**TINY_TRANSFORMER, "transforms": ["sentencepiece"], "src_subword_model": spm,
           "tgt_subword_model": spm, **named}
    with open(spm, "rb") as f:
        data = f.read()
    save_checkpoint(str(path), make_model(TINY_TRANSFORMER, vocab, vocab), vocab, vocab, opt,
                    subword_models={name: data for name in NAMES} if kept else None)


def alone(checkpoint, folder) -> str:
    """``checkpoint`` moved alone into the new folder ``folder``."""
    os.makedirs(folder)
    return shutil.move(str(checkpoint), os.path.join(folder, "model.pt"))


def assert_stored_once(path, data: bytes) -> None:
    stored = torch.load(path, weights_only=True)["subword_models"]
    assert set(stored) == set(NAMES)
    assert stored["src_subword_model"].numpy().tobytes() == data
    assert stored["src_subword_model"].untyped_storage().data_ptr() == \
        stored["tgt_subword_model"].untyped_storage().data_ptr()


# -- the checkpoint alone translates ---------------------------------------------------------
def test_the_shipped_raw_model_copied_alone_translates(tmp_path):
    shutil.copy(SHIPPED, tmp_path / "model.pt")
    run = translate("-model", "model.pt", "-src", os.path.join(ROOT, "data", "demo.en"),
                    "-output", "out.de", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert sorted(os.listdir(tmp_path)) == ["model.pt", "out.de"]
    lines = (tmp_path / "out.de").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(lines) == 8 and lines[0] == "Ein kleiner Junge spielt mit einem roten Ball im Park."
    assert "\u2581" not in "".join(lines)
    assert "model.pt (data/multi30k_en_de.spm)" in run.stderr  # the model kept inside


def test_training_and_averaging_keep_the_sentencepiece_model_once(toy_task, tmp_path):
    spm = make_spm(tmp_path)
    config, _ = toy_task(transforms=["sentencepiece"], src_subword_model=spm,
                         tgt_subword_model=spm, share_vocab=True, train_steps=2,
                         save_checkpoint_steps=2, valid_steps=2)
    last = train(config, progress=False)
    with open(spm, "rb") as f:
        data = f.read()
    assert_stored_once(last, data)
    averaged = str(tmp_path / "averaged.pt")
    average_checkpoints([last], averaged, half=True)
    assert_stored_once(averaged, data)
    os.remove(spm)
    model = alone(averaged, tmp_path / "shipped")
    (tmp_path / "in.txt").write_text("two seven\nONE\n")
    run = translate("-model", model, "-src", "in.txt", "-output", "out.txt", "-max_length", 4,
                    cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert len((tmp_path / "out.txt").read_text(encoding="utf-8").split("\n")) == 3
    assert f"source model {model} ({spm}), target model {model} ({spm})" in run.stderr


def test_a_subword_model_given_on_the_command_line_wins_over_the_kept_one(tmp_path, caplog):
    spm = make_spm(tmp_path)
    checkpoint = str(tmp_path / "model.pt")
    pieces_checkpoint(checkpoint, spm)
    given = str(tmp_path / "given.model")
    shutil.move(spm, given)
    with caplog.at_level(logging.INFO, logger="onmt_lite"):
        translator = build_translator({"model": checkpoint, "tgt_subword_model": given,
                                       "beam_size": 1, "max_length": 3})
    assert (f"(source model {checkpoint} ({spm}), target model {given})") in caplog.text
    pieces = sentencepiece.SentencePieceProcessor(model_file=given).encode("two seven",
                                                                           out_type=str)
    assert translator.translate(["two seven"])[0].src == pieces


@pytest.mark.parametrize("transform, what", [
    ("sentencepiece", "sentencepiece model"), ("bpe", "BPE codes file"),
    ("onmt_tokenize", "sentencepiece model")])
def test_an_older_checkpoint_naming_a_missing_model_says_where_it_looked(tmp_path, transform,
                                                                         what):
    spm = make_spm(tmp_path)
    os.makedirs(tmp_path / "runs")
    named = {"transforms": [transform], "src_subword_model": "models/absent",
             "tgt_subword_model": "models/absent"}
    if transform == "onmt_tokenize":
        named.update(src_subword_type="sentencepiece", tgt_subword_type="sentencepiece")
    pieces_checkpoint(tmp_path / "runs" / "old.pt", spm, kept=False, **named)
    (tmp_path / "in.txt").write_text("two seven\n")
    run = translate("-model", "runs/old.pt", "-src", "in.txt", "-output", "out.txt",
                    cwd=tmp_path)
    assert run.returncode == 1 and not (tmp_path / "out.txt").exists()
    assert "Traceback" not in run.stderr
    assert run.stderr.split("\n")[-2:] == [
        f"translate.py: error: models/absent: no such {what} (named in the checkpoint "
        f"runs/old.pt, looked for at {tmp_path}/runs/models/absent, {tmp_path}/runs/absent, "
        f"{tmp_path}/models/absent; give -src_subword_model)", ""]


# -- each transform's files read from the checkpoint -----------------------------------------
CODES = "#version: 0.2\nt w\ntw o</w>\ne v\n"


@pytest.mark.parametrize("transform", ["bpe", "onmt_tokenize bpe", "onmt_tokenize sentencepiece"])
def test_kept_files_give_the_pieces_of_the_files(tmp_path, transform):
    name, _, kind = transform.partition(" ")
    path = make_spm(tmp_path) if kind == "sentencepiece" else str(tmp_path / "codes")
    if kind != "sentencepiece":
        (tmp_path / "codes").write_text(CODES)
    opt = {"transforms": [name], "src_subword_model": path, "tgt_subword_model": path}
    if kind:
        opt.update(src_subword_type=kind, tgt_subword_type=kind)
    from_files = build_transform(lambda name: None, opt, str(tmp_path / "model.pt"))
    with open(path, "rb") as f:
        data = f.read()
    os.remove(path)
    kept = {name: data for name in NAMES}
    from_checkpoint = build_transform(lambda name: None, opt, str(tmp_path / "model.pt"), kept)
    line = "two seven twelve TWO"
    assert from_checkpoint.encode(line) == from_files.encode(line) != line.split()
    assert from_checkpoint.encode(line, "tgt") == from_files.encode(line, "tgt")


# -- onmt_lite_convert ---------------------------------------------------------------------
def onmt_py_checkpoint(path, spm: str) -> None:
    """An OpenNMT-py checkpoint over the pieces of ``spm``, trained where ``spm`` was
    /training/machine/pieces.model."""
    pieces = sentencepiece_pieces(sentencepiece.SentencePieceProcessor(model_file=spm))
    vocab = Vocab(list(SPECIALS) + pieces)
    write_onmt_py(str(path), make_model(TINY_TRANSFORMER, vocab, vocab), TINY_TRANSFORMER, vocab,
                  vocab, transforms=["sentencepiece", "filtertoolong"],
                  src_subword_model="/training/machine/pieces.model",
                  tgt_subword_model="/training/machine/pieces.model")


def test_convert_keeps_the_model_beside_an_opennmt_py_checkpoint(tmp_path, capsys):
    spm = make_spm(tmp_path)
    with open(spm, "rb") as f:
        data = f.read()
    source = tmp_path / "onmt_py" / "model.pt"
    os.makedirs(source.parent)
    onmt_py_checkpoint(source, spm)
    shutil.move(spm, source.parent / "pieces.model")  # shipped beside it
    target = str(tmp_path / "native.pt")
    assert convert.main(["-model", str(source), "-output", target]) == 0
    assert capsys.readouterr().err == (f"{source} (opennmt-py) -> {target}, keeping "
                                       "/training/machine/pieces.model\n")
    assert_stored_once(target, data)
    model = alone(target, tmp_path / "alone")
    (tmp_path / "in.txt").write_text("two seven\n")
    run = translate("-model", model, "-src", "in.txt", "-output", "out.txt", "-max_length", 4,
                    cwd=tmp_path)
    assert run.returncode == 0, run.stderr


def test_convert_takes_the_files_given_and_warns_of_those_not_found(tmp_path, capsys):
    spm = make_spm(tmp_path)
    source, target = tmp_path / "model.pt", str(tmp_path / "native.pt")
    onmt_py_checkpoint(source, spm)
    assert convert.main(["-model", str(source), "-output", target]) == 0
    looked = f"/training/machine/pieces.model, {tmp_path}/pieces.model"
    assert capsys.readouterr().err == (
        f"onmt_lite_convert: warning: /training/machine/pieces.model: no such subword model "
        f"(named in the checkpoint {source}, looked for at {looked}; give -src_subword_model); "
        f"{target} names it without keeping it\n"
        "onmt_lite_convert: warning: /training/machine/pieces.model: no such subword model "
        f"(named in the checkpoint {source}, looked for at {looked}; give -tgt_subword_model); "
        f"{target} names it without keeping it\n"
        f"{source} (opennmt-py) -> {target}\n")
    assert load_checkpoint(target).subword_models == {}
    assert convert.main(["-model", str(source), "-output", target, "-src_subword_model", spm,
                         "-tgt_subword_model", spm]) == 0
    assert capsys.readouterr().err == f"{source} (opennmt-py) -> {target}, keeping {spm}\n"
    ckpt = load_checkpoint(target)
    assert ckpt.opt["src_subword_model"] == ckpt.opt["tgt_subword_model"] == spm
    with open(spm, "rb") as f:
        assert_stored_once(target, f.read())
    assert convert.main(["-model", SHIPPED.replace("_raw", ""), "-output", target,
                         "-src_subword_model", spm]) == 2  # an option error
    assert capsys.readouterr().err == (
        f"onmt_lite_convert: error: -src_subword_model: the transforms of "
        f"{SHIPPED.replace('_raw', '')} (none) read no src subword model\n")
