"""The onmt_tokenize and bpe transforms: pieces and text against pyonmttok and subword-nmt used
as OpenNMT-py 3.5.1 uses them, on real Multi30k lines (../shared/data/multi30k); option errors;
raw text through a checkpoint over pieces, given on the command line or named in the checkpoint;
OpenNMT-py 3.5.1's own onmt_tokenize and onmt_translate on its raw-text fixture
(tests/reference/onmt_py_tokenize.json, made by tests/reference/make_onmt_py_tokenize.py)."""
import argparse
import ast
import io
import json
import os
import pickle
import re
import shutil

import pyonmttok
import pytest
import torch
from conftest import ROOT, TINY_TRANSFORMER, make_model
from subword_nmt.apply_bpe import BPE
from subword_nmt.learn_bpe import learn_bpe

from onmt_lite.checkpoint import save_checkpoint
from onmt_lite.cli import translate as translate_cli
from onmt_lite.constants import SPECIALS
from onmt_lite.transforms import BPETransform, TransformError, build_transform
from onmt_lite.translate.build import build_translator
from onmt_lite.vocab import Vocab

MULTI30K = os.path.join(ROOT, "..", "shared", "data", "multi30k")
SPM_FIXTURE = os.path.join(ROOT, "..", "shared", "fixtures", "onmt-py-spm")
SPM = os.path.join(SPM_FIXTURE, "spm.model")
AGGRESSIVE = "{'mode': 'aggressive', 'joiner_annotate': True}"
needs_multi30k = pytest.mark.skipif(not os.path.isdir(MULTI30K),
                                    reason="../shared/data/multi30k is absent")
needs_spm = pytest.mark.skipif(not os.path.isfile(SPM),
                               reason="../shared/fixtures/onmt-py-spm is absent")


def multi30k(name: str) -> list:
    with open(os.path.join(MULTI30K, name), encoding="utf-8") as f:
        return f.read().split("\n")[:-1]


def options(**given):
    return given.get


@pytest.fixture(scope="module")
def codes(tmp_path_factory) -> dict:
    """subword-nmt BPE codes ({"en": path, "de": path}), 500 merges learned on 3000 lines."""
    if not os.path.isdir(MULTI30K):
        pytest.skip("../shared/data/multi30k is absent")
    folder = tmp_path_factory.mktemp("bpe")
    paths = {}
    for lang in ("en", "de"):
        text = "\n".join(multi30k(f"train.{lang}")[:3000]) + "\n"
        paths[lang] = str(folder / f"codes.{lang}")
        with open(paths[lang], "w", encoding="utf-8") as out:
            learn_bpe(io.StringIO(text), out, 500)
    return paths


def test_bpe_pieces_on_a_hand_checked_case(tmp_path):
    path = tmp_path / "codes"
    path.write_text("#version: 0.2\nl o\nlo w</w>\ne r</w>\n")
    bpe = BPETransform(str(path), str(path))
    # "lower": l o w e r</w> -> lo w e r</w> -> lo w er</w>; "lowest" only merges l o;
    # the double space is no word
    assert bpe.encode("low lower  lowest") == ["low", "lo@@", "w@@", "er",
                                               "lo@@", "w@@", "e@@", "s@@", "t"]
    assert bpe.decode(["lo@@", "w", "lo@@", "w@@", "er", "e@@"]) == "low lower e"


@needs_multi30k
def test_bpe_equals_subword_nmt_on_multi30k(codes):
    # val.de has one no-break space (U+00A0) and train.de more: subword-nmt (and so OpenNMT-py)
    # keeps it inside a word, where pyonmttok would split the word there
    lines = multi30k("val.de") + [line for line in multi30k("train.de") if "\xa0" in line][:20]
    assert sum("\xa0" in line for line in lines) == 21
    transform = build_transform(options(transforms=["bpe"], src_subword_model=codes["en"],
                                        tgt_subword_model=codes["de"]), {}, "")
    with open(codes["de"], encoding="utf-8") as f:
        reference = BPE(codes=f)
    for line in lines:
        pieces = transform.encode(line, "tgt")
        assert pieces == reference.segment_tokens(line.strip().split(" "))
        assert transform.decode(pieces) == " ".join(line.split(" ")).strip()
    assert transform.encode(lines[0]) != transform.encode(lines[0], "tgt")  # en codes on src


def onmt_tokenize_cases(codes):
    """(options of the transform, pyonmttok.Tokenizer arguments as OpenNMT-py builds them)."""
    return [
        ({}, {"mode": "none"}),  # OpenNMT-py's defaults: the whole line is one token
        ({"subword_type": "bpe", "subword_model": codes, "onmttok_kwargs": AGGRESSIVE},
         {"bpe_model_path": codes, "bpe_dropout": 0, "mode": "aggressive",
          "joiner_annotate": True}),
        ({"subword_type": "sentencepiece", "subword_model": SPM},
         {"sp_model_path": SPM, "sp_nbest_size": 1, "sp_alpha": 0, "mode": "none"}),
        ({"onmttok_kwargs": "{'mode': 'conservative', 'joiner_annotate': True, "
                            "'case_markup': True, 'segment_numbers': True}"},
         {"mode": "conservative", "joiner_annotate": True, "case_markup": True,
          "segment_numbers": True}),
    ]


@needs_multi30k
@pytest.mark.parametrize("case", range(4), ids=["defaults", "bpe", "sentencepiece", "kwargs"])
def test_onmt_tokenize_equals_pyonmttok_on_multi30k(codes, case):
    if case == 2 and not os.path.isfile(SPM):
        pytest.skip("../shared/fixtures/onmt-py-spm is absent")
    given, arguments = onmt_tokenize_cases(codes["de"])[case]
    transform = build_transform(options(transforms=["onmt_tokenize"], **{
        f"{side}_{name}": value for side in ("src", "tgt") for name, value in given.items()}),
        {}, "")
    tokenizer = pyonmttok.Tokenizer(**arguments)
    # pickled as the server sends it from the process that loads the model to its own
    copied = pickle.loads(pickle.dumps(transform))
    for line in multi30k("val.de")[:300]:
        pieces = transform.encode(line, "tgt")
        assert pieces == tokenizer(line.strip()) == copied.encode(line, "tgt")
        text = transform.decode(pieces)
        assert copied.decode(pieces) == text
        assert text == tokenizer.detokenize(pieces)
        assert text.split() == line.split()  # the words back (a no-break space may be a space)


def test_onmt_tokenize_keeps_opennmt_py_markers():
    transform = build_transform(options(transforms=["onmt_tokenize"], src_onmttok_kwargs=AGGRESSIVE,
                                        tgt_onmttok_kwargs=AGGRESSIVE), {}, "")
    # each </s>-separated sentence and each ｟_mask_before_｠ chunk is tokenized on its own
    assert transform.encode(" Two dogs. </s> A cat｟_mask_before_｠runs! ") == [
        "Two", "dogs", "￭.", "</s>", "A", "cat", "<blank>", "runs", "￭!"]
    # ｟newline｠ is a placeholder to pyonmttok; a newline it writes comes back as ｟newline｠
    assert transform.encode("a｟newline｠b") == ["a", "￭｟newline｠￭", "b"]
    assert transform.decode(["a", "￭\n￭", "b"]) == "a｟newline｠b"


@needs_spm
def test_onmt_tokenize_with_sentencepiece_gives_newlines_to_the_model():
    both = {"transforms": ["onmt_tokenize"], "src_subword_type": "sentencepiece",
            "src_subword_model": SPM, "tgt_subword_type": "sentencepiece", "tgt_subword_model": SPM}
    # as OpenNMT-py 3.5.1: ｟newline｠ becomes "\n" for sentencepiece (a space to it) unless the
    # target kwargs preserve placeholders
    transform = build_transform(options(**both), {}, "")
    assert transform.encode("a｟newline｠b") == transform.encode("a b") == ["\u2581a", "\u2581b"]
    transform = build_transform(options(**both, tgt_onmttok_kwargs="{'mode': 'none', "
                                        "'preserve_placeholders': True}"), {}, "")
    assert "\uff5fnewline\uff60" in "".join(transform.encode("a｟newline｠b"))


def test_onmttok_kwargs_errors_name_the_option(tmp_path):
    def build(**given):
        return build_transform(options(transforms=["onmt_tokenize"], **given), {}, "")

    for text in ("{'mode': 'aggressive'", "['mode', 'none']", "dict(mode='none')"):
        with pytest.raises(TransformError, match=r"^-src_onmttok_kwargs: expected a Python dict"):
            build(src_onmttok_kwargs=text)
    made = tmp_path / "made"  # read without eval: the call is not run
    with pytest.raises(TransformError, match="expected a Python dict"):
        build(tgt_onmttok_kwargs=f"open({str(made)!r}, 'w')")
    assert not made.exists()
    with pytest.raises(TransformError, match=r"^-tgt_onmttok_kwargs: 'joiner_anotate' is not a "
                                             r"pyonmttok.Tokenizer argument$"):
        build(tgt_onmttok_kwargs="{'mode': 'none', 'joiner_anotate': True}")
    with pytest.raises(TransformError, match="-src_onmttok_kwargs: pyonmttok needs a 'mode'"):
        build(src_onmttok_kwargs="{'joiner_annotate': True}")
    with pytest.raises(TransformError, match="^-src_onmttok_kwargs: invalid tokenization mode: "
                                             "fancy$"):
        build(src_onmttok_kwargs="{'mode': 'fancy'}")
    with pytest.raises(TransformError, match="-src_onmttok_kwargs: pyonmttok.Tokenizer rejects a "
                                             "value of the wrong type"):
        build(src_onmttok_kwargs="{'mode': 'none', 'joiner_annotate': 'yes'}")


def test_subword_set_up_errors_name_the_file_and_option(tmp_path, capsys):
    codes = tmp_path / "codes"
    codes.write_text("#version: 0.2\nl o\n")
    gone = str(tmp_path / "gone.codes")
    with pytest.raises(TransformError, match="^-transforms bpe needs -tgt_subword_model$"):
        build_transform(options(transforms=["bpe"], src_subword_model=str(codes)), {}, "")
    with pytest.raises(TransformError, match=re.escape(
            f"{gone}: no such BPE codes file (given by -tgt_subword_model)")):
        BPETransform(str(codes), gone)
    text = tmp_path / "text.codes"
    text.write_text("not a codes file\n")
    with pytest.raises(TransformError, match=re.escape(
            f"{text}: not a subword-nmt BPE codes file (-src_subword_model): Error: invalid line "
            "1 in BPE codes file: not a codes file")):
        BPETransform(str(text), str(codes))
    binary = tmp_path / "binary.codes"
    binary.write_bytes(bytes(range(256)))
    with pytest.raises(TransformError, match="binary.codes: not a subword-nmt BPE codes file"):
        BPETransform(str(codes), str(binary))
    assert capsys.readouterr().err == ""  # subword-nmt's own complaint is in the message only

    def build(**given):
        return build_transform(options(transforms=["onmt_tokenize"], **given), {}, "")

    with pytest.raises(TransformError, match="^-src_subword_type bpe needs -src_subword_model$"):
        build(src_subword_type="bpe")
    with pytest.raises(TransformError, match="^-tgt_subword_type: 'wordpiece' is not one of "
                                             "none, sentencepiece, bpe$"):
        build(tgt_subword_type="wordpiece")
    with pytest.raises(TransformError, match="^-src_onmttok_kwargs: 'bpe_model_path' is set by "
                                             "-src_subword_type and -src_subword_model$"):
        build(src_subword_type="bpe", src_subword_model=str(codes),
              src_onmttok_kwargs=f"{{'mode': 'none', 'bpe_model_path': {str(codes)!r}}}")
    with pytest.raises(TransformError, match=re.escape(
            f"{text}: not a subword-nmt BPE codes file (-tgt_subword_model)")):
        build(tgt_subword_type="bpe", tgt_subword_model=str(text))  # pyonmttok would take it
    with pytest.raises(TransformError, match=f"{codes}: not a sentencepiece model "
                                             r"\(-src_subword_model\)"):
        build(src_subword_type="sentencepiece", src_subword_model=str(codes))
    with pytest.raises(TransformError, match="^-transforms: one subword transform at a time, "
                                             "got onmt_tokenize, bpe$"):
        build_transform(options(transforms=["onmt_tokenize", "filtertoolong", "bpe"]), {}, "")


def test_command_line_errors_take_one_line(src_vocab, tgt_vocab, tmp_path, capsys):
    ckpt, src = str(tmp_path / "m.pt"), tmp_path / "in.en"
    save_checkpoint(ckpt, make_model(TINY_TRANSFORMER, src_vocab, tgt_vocab), src_vocab,
                    tgt_vocab, TINY_TRANSFORMER)
    src.write_text("a b\n")
    args = ["-model", ckpt, "-src", str(src), "-output", str(tmp_path / "out"),
            "-transforms", "onmt_tokenize"]
    assert translate_cli.main(args + ["-tgt_onmttok_kwargs", "{'mode': 'fancy'}"]) == 2
    assert capsys.readouterr().err == ("translate.py: error: -tgt_onmttok_kwargs: invalid "
                                       "tokenization mode: fancy\n")
    missing = ["-model", ckpt, "-src", str(src), "-output", str(tmp_path / "out"),
               "-transforms", "bpe", "-src_subword_model", str(tmp_path / "no.codes")]
    assert translate_cli.main(missing) == 2  # an option missing: an option error
    assert capsys.readouterr().err == "translate.py: error: -transforms bpe needs -tgt_subword_model\n"
    with pytest.raises(SystemExit) as stop:
        translate_cli.main(args + ["-src_subword_type", "wordpiece"])
    assert stop.value.code == 2
    assert "argument -src_subword_type/--src_subword_type: invalid choice: 'wordpiece'" \
        in capsys.readouterr().err


# -- raw text through a checkpoint over pieces --------------------------------------------
SOURCE_LINES, TARGET_LINES = "test_2016_flickr.en", "test_2016_flickr.de"


def transform_options(codes: dict, name: str) -> dict:
    """-transforms NAME and its options, BPE codes learned on Multi30k on both sides."""
    given = {"transforms": [name, "filtertoolong"], "src_subword_model": codes["en"],
             "tgt_subword_model": codes["de"]}
    if name == "onmt_tokenize":
        given.update(src_subword_type="bpe", tgt_subword_type="bpe",
                     src_onmttok_kwargs=AGGRESSIVE, tgt_onmttok_kwargs=AGGRESSIVE)
    return given


def pieces_checkpoint(path: str, codes: dict, name: str, **checkpoint_options) -> None:
    """A seeded tiny Transformer whose source vocabulary holds the pieces of the first 8 test
    lines and whose target vocabulary only pieces that are not words of their own ("@@" or
    "￭" in them), so that every prediction reads differently once detokenized."""
    transform = build_transform(options(**transform_options(codes, name)), {}, "")
    src = {p for line in multi30k(SOURCE_LINES)[:8] for p in transform.encode(line)}
    tgt = {p for line in multi30k(TARGET_LINES)[:40] for p in transform.encode(line, "tgt")
           if "@@" in p or "\uffed" in p}
    src_vocab, tgt_vocab = Vocab(list(SPECIALS) + sorted(src)), Vocab(list(SPECIALS) + sorted(tgt))
    save_checkpoint(path, make_model(TINY_TRANSFORMER, src_vocab, tgt_vocab), src_vocab,
                    tgt_vocab, {**TINY_TRANSFORMER, **checkpoint_options})


def reference_detokenize(codes: dict, name: str):
    """The target side's detokenizer as OpenNMT-py 3.5.1 applies it (the list of pieces)."""
    if name == "bpe":
        return lambda pieces: re.sub(r"(@@ )|(@@ ?$)", "", " ".join(pieces))
    tokenizer = pyonmttok.Tokenizer(bpe_model_path=codes["de"], bpe_dropout=0,
                                    **ast.literal_eval(AGGRESSIVE))
    return tokenizer.detokenize


@needs_multi30k
@pytest.mark.parametrize("name", ["onmt_tokenize", "bpe"])
def test_command_line_shows_pieces_and_writes_text(codes, name, tmp_path, caplog):
    ckpt = str(tmp_path / "pieces.pt")
    pieces_checkpoint(ckpt, codes, name)
    lines = multi30k(SOURCE_LINES)[:8]
    src, out = tmp_path / "in.en", tmp_path / "out.de"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    flags = [item for key, value in transform_options(codes, name).items()
             for item in [f"-{key}", *(value if isinstance(value, list) else [value])]]
    with caplog.at_level("INFO", logger="onmt_lite"):
        assert translate_cli.main(["-model", ckpt, "-src", str(src), "-output", str(out),
                                   "-beam_size", "2", "-min_length", "2", "-max_length", "5",
                                   "-verbose", "-attn_debug", *flags]) == 0
    transform = build_transform(options(**transform_options(codes, name)), {}, "")
    sources = [ast.literal_eval(s) for s in re.findall(r"^SENT \d+: (\[.*\])$", caplog.text, re.M)]
    assert sources == [transform.encode(line) for line in lines]  # pieces, all in the vocab
    preds = [p.split(" ") for p in re.findall(r"^PRED \d+: (.*)$", caplog.text, re.M)]
    written = out.read_text(encoding="utf-8").split("\n")[:-1]
    detokenize = reference_detokenize(codes, name)
    assert written == [detokenize(pred) for pred in preds]
    assert all(text != " ".join(pred) for text, pred in zip(written, preds))
    header = [p[:7] for p in sources[0]]  # -attn_debug: source pieces head the columns
    assert any(line.split() == header for line in caplog.text.split("\n"))
    assert any(line.split()[:1] == [preds[0][0][:10]] for line in caplog.text.split("\n")
               if "*" in line)  # and target pieces the rows


@needs_multi30k
@pytest.mark.parametrize("name", ["onmt_tokenize", "bpe"])
def test_the_checkpoint_transforms_apply_with_files_beside_it(codes, name, tmp_path, caplog):
    folder = tmp_path / "shipped"
    folder.mkdir()
    for lang in ("en", "de"):
        shutil.copy(codes[lang], folder / f"codes.{lang}")
    named = transform_options(codes, name)
    # the model files as the training machine named them; OpenNMT-py keeps kwargs as a dict
    named.update(src_subword_model="/training/machine/codes.en", tgt_subword_model="codes.de")
    if name == "onmt_tokenize":
        named["src_onmttok_kwargs"] = ast.literal_eval(AGGRESSIVE)
    ckpt = str(folder / "model.pt")
    pieces_checkpoint(ckpt, codes, name, **named)
    lines = multi30k(SOURCE_LINES)[:3]
    with caplog.at_level("INFO", logger="onmt_lite"):
        translator = build_translator({"model": ckpt, "beam_size": 2, "min_length": 2,
                                       "max_length": 5})
    assert (f"applying the checkpoint's transforms ['{name}', 'filtertoolong'] (source model "
            f"{folder / 'codes.en'}, target model {folder / 'codes.de'})") in caplog.text
    given = build_translator({"model": ckpt, "beam_size": 2, "min_length": 2, "max_length": 5,
                              **transform_options(codes, name)})
    named_in_checkpoint, given_here = translator.translate(lines), given.translate(lines)
    assert [t.src for t in named_in_checkpoint] == [t.src for t in given_here] \
        != [line.split() for line in lines]
    assert [t.texts for t in named_in_checkpoint] == [t.texts for t in given_here]
    detokenize = reference_detokenize(codes, name)
    assert all(t.texts == [detokenize(p) for p in t.preds] for t in named_in_checkpoint)
    if name == "onmt_tokenize":  # an option given wins over the checkpoint's
        spaced = build_translator({"model": ckpt, "src_onmttok_kwargs": "{'mode': 'space'}",
                                   "beam_size": 1, "max_length": 2})
        tokenizer = pyonmttok.Tokenizer(bpe_model_path=codes["en"], bpe_dropout=0, mode="space")
        assert spaced.translate(lines[:1])[0].src == tokenizer(lines[0]) != given_here[0].src


# -- an OpenNMT-py checkpoint that names onmt_tokenize -------------------------------------
# OpenNMT-py 3.5.1's own onmt_tokenize transform and onmt_translate on the raw-text fixture, beam
# 5, the first three test lines, sentencepiece on both sides with each case's onmttok kwargs:
# made by tests/reference/make_onmt_py_tokenize.py with the peers virtualenv.
with open(os.path.join(ROOT, "tests", "reference", "onmt_py_tokenize.json"), encoding="utf-8") as f:
    ONMT_PY_TOKENIZE = json.load(f)


@pytest.fixture(scope="module")
def onmt_tokenize_checkpoint(tmp_path_factory):
    """The raw-text fixture trained with -transforms sentencepiece, relabelled as onmt_tokenize
    over the same spm.model, with pyonmttok's mode none on both sides."""
    with torch.serialization.safe_globals([argparse.Namespace]):  # OpenNMT-py's options
        data = torch.load(os.path.join(SPM_FIXTURE, "model.pt"), map_location="cpu",
                          weights_only=True)
    opt = data["opt"]
    opt.transforms = ["onmt_tokenize", "filtertoolong"]
    opt.src_subword_type = opt.tgt_subword_type = "sentencepiece"
    opt.src_subword_model = opt.tgt_subword_model = SPM
    opt.src_onmttok_kwargs = opt.tgt_onmttok_kwargs = {"mode": "none"}
    ckpt = str(tmp_path_factory.mktemp("onmt_tokenize") / "model.pt")
    torch.save(data, ckpt)
    return ckpt


@needs_spm
@needs_multi30k
@pytest.mark.parametrize("case", list(ONMT_PY_TOKENIZE["cases"]))
def test_opennmt_py_checkpoint_naming_onmt_tokenize(onmt_tokenize_checkpoint, case):
    """Source pieces, the pieces the model sees, hypothesis pieces, score and written line are
    OpenNMT-py's, with the onmttok kwargs given on the command line."""
    spec = ONMT_PY_TOKENIZE["cases"][case]
    lines = multi30k(SOURCE_LINES)[:len(spec["output"])]
    translator = build_translator({
        "model": onmt_tokenize_checkpoint, "beam_size": ONMT_PY_TOKENIZE["beam_size"],
        "src_onmttok_kwargs": repr(spec["src_onmttok_kwargs"]),
        "tgt_onmttok_kwargs": repr(spec["tgt_onmttok_kwargs"])})
    results = translator.translate(lines)
    assert [t.src for t in results] == spec["source_pieces"]
    assert [t.src_vocab for t in results] == spec["sent"]
    assert [" ".join(t.preds[0]) for t in results] == spec["pred"]
    assert [t.scores[0] for t in results] == pytest.approx(spec["pred_score"], abs=1e-4)
    assert [t.texts[0] for t in results] == spec["output"]


@needs_spm
@needs_multi30k
def test_the_checkpoints_onmt_tokenize_is_what_opennmt_py_writes_with_sentencepiece(
        onmt_tokenize_checkpoint):
    """Named in the checkpoint (no option given), onmt_tokenize with mode none writes what
    OpenNMT-py 3.5.1 writes with these kwargs given, and with -transforms sentencepiece (the
    fixture's own beam-5 reference)."""
    spec = ONMT_PY_TOKENIZE["cases"]["mode none on both sides"]
    lines = multi30k(SOURCE_LINES)[:len(spec["output"])]
    with open(os.path.join(SPM_FIXTURE, "refs", "test_2016_flickr", "model.beam5.txt"),
              encoding="utf-8") as f:
        sentencepiece_output = f.read().split("\n")[:len(lines)]
    assert spec["output"] == sentencepiece_output
    translator = build_translator({"model": onmt_tokenize_checkpoint, "beam_size": 5})
    assert [t.texts[0] for t in translator.translate(lines)] == spec["output"]
