"""Training on a toy copy task: perplexity falls, checkpoints and pruning, resuming, averaging,
config checks, the command line, and the trained model translating."""
import logging
import os
import re
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, TOY_WORDS, toy_pairs

from onmt_lite.checkpoint import load_checkpoint, load_model
from onmt_lite.cli import train as train_cli
from onmt_lite.corpus import read_parallel
from onmt_lite.models import build_model
from onmt_lite.train.batching import make_examples
from onmt_lite.train.trainer import average_checkpoints, last_checkpoints, train, validate
from onmt_lite.translate import build_translator

# model -> (train_steps, save_checkpoint_steps, keep_checkpoint); ~4 s and ~2 s on one thread
RUNS = {"transformer": (800, 100, 2), "rnn": (300, 100, 2)}


class Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture(autouse=True)
def restore_log_handlers():
    """Detaches (and closes) the handlers a test's train() calls left on the training logger."""
    logger = logging.getLogger("onmt_lite.train")
    before = list(logger.handlers)
    yield
    for handler in [h for h in logger.handlers if h not in before]:
        logger.removeHandler(handler)
        handler.close()


def valid_examples(ckpt, config):
    src, tgt = read_parallel(config["data"]["valid"]["path_src"],
                             config["data"]["valid"]["path_tgt"])
    return make_examples(src, tgt, ckpt.src_vocab, ckpt.tgt_vocab)


def checkpoint_files(folder):
    return sorted(os.listdir(folder))


@pytest.fixture(scope="module", params=list(RUNS))
def trained(request, tmp_path_factory, toy_task_factory):
    """Trains once per model type; returns (config, last checkpoint, validation log lines)."""
    model = request.param
    steps, every, keep = RUNS[model]
    folder = tmp_path_factory.mktemp(f"train-{model}")
    config, _ = toy_task_factory(folder, model, train_steps=steps, save_checkpoint_steps=every,
                                 keep_checkpoint=keep, valid_steps=100)
    records = Records()
    logger = logging.getLogger("onmt_lite.train")
    logger.addHandler(records)
    try:
        last = train(config, progress=False)
    finally:
        logger.removeHandler(records)
    validations = [m for m in records.messages if m.startswith("validation step")]
    return model, config, last, validations


def test_validation_perplexity_falls(trained):
    model_type, config, last, validations = trained
    steps = RUNS[model_type][0]
    model, ckpt = load_model(last)
    examples = valid_examples(ckpt, config)
    final = validate(model, examples, ckpt.src_vocab, ckpt.tgt_vocab, 512, "cpu")
    torch.manual_seed(0)
    untrained = build_model(ckpt.opt, len(ckpt.src_vocab), len(ckpt.tgt_vocab))
    initial = validate(untrained, examples, ckpt.src_vocab, ckpt.tgt_vocab, 512, "cpu")
    # an untrained model is about as good as uniform over the 14 target tokens
    assert initial["ppl"] > 5
    assert final["ppl"] < 1.5 and final["ppl"] < initial["ppl"] / 5
    assert final["acc"] > 90
    # one validation every 100 steps, logged; the last one is the recomputed one
    logged = [(int(m.group(1)), float(m.group(2))) for m in
              (re.match(r"validation step (\d+): ppl ([\d.]+);", line) for line in validations)]
    assert [s for s, _ in logged] == list(range(100, steps + 1, 100))
    assert logged[-1][1] == pytest.approx(final["ppl"], abs=2e-3)
    assert logged[-1][1] < logged[0][1]


def test_checkpoints_every_n_steps_and_pruning(trained):
    model_type, config, last, _ = trained
    steps, every, keep = RUNS[model_type]
    kept = [f"model_step_{s}.pt" for s in range(steps - (keep - 1) * every, steps + 1, every)]
    folder = os.path.dirname(config["save_model"])
    assert checkpoint_files(folder) == sorted(kept)
    assert last == os.path.join(folder, f"model_step_{steps}.pt")
    assert last_checkpoints(config["save_model"], 5) == [os.path.join(folder, k) for k in kept]
    assert last_checkpoints(config["save_model"], 1) == [last]


def test_checkpoint_holds_the_train_state(trained):
    model_type, _, last, _ = trained
    steps = RUNS[model_type][0]
    ckpt = load_checkpoint(last)
    assert ckpt.train_state["step"] == steps
    adam = ckpt.train_state["optim"]["state"]
    assert adam and all(int(s["step"]) == steps for s in adam.values())
    assert ckpt.opt["model_type"] == model_type


def test_trained_model_translates_training_sentences(trained):
    _, config, last, _ = trained
    translator = build_translator({"model": last, "beam_size": 3})
    src, tgt = read_parallel(config["data"]["corpus_1"]["path_src"],
                             config["data"]["corpus_1"]["path_tgt"])
    results = translator.translate(src[:20])
    right = [" ".join(t.preds[0]) == ref for t, ref in zip(results, tgt[:20])]
    assert sum(right) >= 17, [" ".join(t.preds[0]) for t in results]


def test_resume_continues_from_the_saved_step(trained, tmp_path):
    model_type, config, last, _ = trained
    steps, every, _ = RUNS[model_type]
    resumed_prefix = str(tmp_path / "resumed")
    resumed = train({**config, "train_from": last, "train_steps": steps + 20,
                     "save_model": resumed_prefix}, progress=False)
    # no checkpoint at 100, 200, ...: counting went on from the saved step
    assert resumed == f"{resumed_prefix}_step_{steps + 20}.pt"
    assert os.listdir(tmp_path) == [os.path.basename(resumed)]
    ckpt = load_checkpoint(resumed)
    assert ckpt.train_state["step"] == steps + 20
    # the optimizer state came along: Adam's step counters went on too
    assert all(int(s["step"]) == steps + 20 for s in ckpt.train_state["optim"]["state"].values())
    # and the weights: 20 more steps from a trained model, still good
    model, _ = load_model(resumed)
    stats = validate(model, valid_examples(ckpt, config), ckpt.src_vocab, ckpt.tgt_vocab, 512,
                     "cpu")
    assert stats["ppl"] < 1.5


def test_average_checkpoints(trained, tmp_path):
    _, config, _, _ = trained
    paths = last_checkpoints(config["save_model"], 2)
    assert len(paths) == 2
    output = str(tmp_path / "avg.pt")
    average_checkpoints(paths, output)
    states = [load_model(p)[0].state_dict() for p in paths]
    averaged = load_model(output)[0].state_dict()
    assert set(averaged) == set(states[0])
    for name, tensor in averaged.items():
        torch.testing.assert_close(tensor, (states[0][name] + states[1][name]) / 2,
                                   atol=1e-6, rtol=0)
    assert not torch.equal(states[0]["generator.weight"], states[1]["generator.weight"])
    ckpt = load_checkpoint(output)
    assert ckpt.train_state == {}
    assert ckpt.src_vocab.itos == load_checkpoint(paths[0]).src_vocab.itos


def test_average_checkpoints_half(trained, tmp_path):
    _, config, _, _ = trained
    output = str(tmp_path / "avg16.pt")
    average_checkpoints(last_checkpoints(config["save_model"], 2), output, half=True)
    payload = torch.load(output, weights_only=True)
    assert all(t.dtype == torch.float16 for t in payload["model"].values()
               if t.is_floating_point())


def test_keep_checkpoint_zero_keeps_all(toy_task, tmp_path):
    config, _ = toy_task(train_steps=6, save_checkpoint_steps=2, keep_checkpoint=0,
                         valid_steps=100)
    last = train(config, progress=False)
    assert checkpoint_files(tmp_path / "run") == [f"model_step_{s}.pt" for s in (2, 4, 6)]
    assert last.endswith("model_step_6.pt")


def test_last_step_is_saved_even_off_the_period(toy_task, tmp_path):
    config, _ = toy_task("rnn", train_steps=5, save_checkpoint_steps=3, valid_steps=100)
    assert train(config, progress=False).endswith("model_step_5.pt")
    assert checkpoint_files(tmp_path / "run") == ["model_step_3.pt", "model_step_5.pt"]


def test_vocabulary_options(toy_task):
    config, _ = toy_task(train_steps=1, vocab_size_multiple=8, tgt_vocab_size=4)
    ckpt = load_checkpoint(train(config, progress=False))
    assert len(ckpt.src_vocab) == 16  # 4 specials + 10 words -> padded to 16
    assert ckpt.src_vocab.itos[-2:] == ["averyunlikelytoken0", "averyunlikelytoken1"]
    assert len(ckpt.tgt_vocab) == 8  # 4 specials + the 4 most frequent words
    assert set(ckpt.tgt_vocab.itos[4:]) < {w.upper() for w in TOY_WORDS}


def test_unknown_config_keys_are_refused(toy_task):
    config, _ = toy_task(train_steps=1)
    with pytest.raises(ValueError, match="unknown config keys: bogus, learning_rat"):
        train({**config, "learning_rat": 0.1, "bogus": 1}, progress=False)


def test_config_without_data_is_refused(toy_task):
    config, _ = toy_task(train_steps=1)
    del config["data"]["valid"]
    with pytest.raises(ValueError, match=r"config lacks data\.valid\.path_src / path_tgt"):
        train(config, progress=False)


def test_mismatched_corpus_is_refused(toy_task, tmp_path):
    config, _ = toy_task(train_steps=1)
    with open(config["data"]["corpus_1"]["path_tgt"], "a", encoding="utf-8") as f:
        f.write("EXTRA\n")
    with pytest.raises(ValueError, match="has 401 lines but .* has 400"):
        train(config, progress=False)


def test_cli_reports_config_errors(toy_task, tmp_path, capsys):
    _, config_path = toy_task(train_steps=1, bogus=True)
    assert train_cli.main(["-config", config_path, "-no_progress"]) == 2
    assert "unknown config keys: bogus" in capsys.readouterr().err
    missing = str(tmp_path / "missing.yaml")
    assert train_cli.main(["-config", missing]) == 2
    assert missing in capsys.readouterr().err


def test_cli_trains_and_averages(toy_task, tmp_path):
    _, config_path = toy_task("rnn", train_steps=1000, save_checkpoint_steps=2,
                              keep_checkpoint=3, valid_steps=100, threads=1)
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "onmt_lite.cli.train", "-config", config_path, "-no_progress",
         "-train_steps", "4", "-average_last", "2"],
        cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    last = str(tmp_path / "run" / "model_step_4.pt")
    assert done.stdout.strip() == last
    assert "averaged 2 checkpoints into" in done.stderr
    assert checkpoint_files(tmp_path / "run") == ["model_avg.pt", "model_step_2.pt",
                                                  "model_step_4.pt"]
    assert load_checkpoint(last).train_state["step"] == 4


def test_toy_corpus_is_deterministic():
    assert toy_pairs(5, seed=1) == toy_pairs(5, seed=1)
    assert all(tgt == src.upper() for src, tgt in toy_pairs(50, seed=3))


def test_log_file(toy_task, tmp_path):
    log = tmp_path / "train.log"
    config, _ = toy_task("rnn", train_steps=2, valid_steps=1, log_file=str(log))
    train(config, progress=False)
    text = log.read_text()
    assert "validation step 1:" in text and "validation step 2:" in text
    assert "saved " in text


def test_log_file_of_one_run_gets_nothing_from_the_next(tmp_path, toy_task_factory):
    logs = []
    for name in ("first", "second"):
        folder = tmp_path / name
        folder.mkdir()
        config, _ = toy_task_factory(folder, "rnn", train_steps=1, valid_steps=1,
                                     log_file=str(folder / "train.log"))
        train(config, progress=False)
        logs.append(folder / "train.log")
    assert str(tmp_path / "second") not in logs[0].read_text()


class Spinning(Exception):
    pass


def test_training_with_no_usable_example_is_refused(toy_task, monkeypatch):
    from onmt_lite.train import trainer
    calls = []

    def batches(examples, *args, **kwargs):
        calls.append(len(examples))
        if len(calls) > 100:
            raise Spinning(f"token_batches called {len(calls)} times with {calls[-1]} examples")
        return original(examples, *args, **kwargs)

    original = trainer.token_batches
    monkeypatch.setattr(trainer, "token_batches", batches)
    config, _ = toy_task("rnn", train_steps=5, max_len=1)  # every sentence has 2-5 words
    with pytest.raises(ValueError):
        train(config, progress=False)


# -- the shipped model's shape ---------------------------------------------------------------
SHIPPED_RECIPE = os.path.join(ROOT, "configs", "transformer_multi30k.yaml")
SHAPE_KEYS = ("model_type", "enc_layers", "dec_layers", "hidden_size", "word_vec_size", "heads",
              "transformer_ff", "dropout", "attention_dropout", "share_decoder_embeddings",
              "param_init_glorot", "label_smoothing", "adam_beta1", "adam_beta2")


def shipped_shape() -> dict:
    import yaml
    with open(SHIPPED_RECIPE, encoding="utf-8") as f:
        recipe = yaml.safe_load(f)
    return {key: recipe[key] for key in SHAPE_KEYS}


def test_the_shipped_shape_trains_and_its_loss_goes_down(toy_task, tmp_path):
    """3 encoder and 3 decoder layers of 256, as the shipped model: the in-place self-attention
    cache must stay off the training path (a multi-layer decoder once failed at step 1)."""
    shape = shipped_shape()
    assert shape["dec_layers"] >= 3
    config, _ = toy_task(**shape, train_steps=24, report_every=4, valid_steps=24,
                         learning_rate=3e-4, decay_method="none", threads=2,
                         log_file=str(tmp_path / "logs" / "train.log"),
                         save_model=str(tmp_path / "new" / "folder" / "model"))
    last = train(config, progress=False)  # both folders are created
    assert last == str(tmp_path / "new" / "folder" / "model_step_24.pt")
    reports = re.findall(r"step (\d+)/24; acc [\d.]+; ppl ([\d.]+)",
                         (tmp_path / "logs" / "train.log").read_text())
    ppl = [float(p) for _, p in reports]
    assert len(ppl) == 6 and ppl[-1] < 0.5 * ppl[0], ppl
    assert load_checkpoint(last).opt["dec_layers"] == shape["dec_layers"]


def test_teacher_forcing_with_autograd_equals_the_cached_forward(src_vocab, tgt_vocab,
                                                                 padded_batch):
    opt = {**shipped_shape(), "hidden_size": 32, "word_vec_size": 32, "transformer_ff": 64,
           "dropout": 0.0, "attention_dropout": 0.0}
    torch.manual_seed(0)
    model = build_model(opt, len(src_vocab), len(tgt_vocab), src_vocab.pad, tgt_vocab.pad)
    src, src_len, tgt = padded_batch
    model.train()
    log_probs, attn = model(src, src_len, tgt)
    log_probs.sum().backward()  # the gradient reaches every decoder layer
    assert all(layer.self_attn.linear_query.weight.grad is not None
               for layer in model.decoder.layers)
    with torch.no_grad():
        cached, cached_attn = model(src, src_len, tgt)
    torch.testing.assert_close(log_probs, cached)
    torch.testing.assert_close(attn, cached_attn)


def test_incremental_steps_under_autograd_are_refused(transformer_model, padded_batch):
    src, src_len, tgt = padded_batch
    memory, final = transformer_model.encode(src, src_len)
    transformer_model.decoder.init_state(src_len, memory, final)
    transformer_model.decoder.step(tgt[:, 0])
    with pytest.raises(RuntimeError, match="no_grad"):
        transformer_model.decoder.step(tgt[:, 1])


@pytest.mark.parametrize("key, value, message", [
    ("train_steps", 2.5, "train_steps: expected an integer, got 2.5"),
    ("train_steps", 0, "train_steps: must be at least 1, got 0"),
    ("dec_layers", True, "dec_layers: expected an integer, got True"),
    ("learning_rate", "fast", "learning_rate: expected a number, got 'fast'"),
    ("share_decoder_embeddings", "no", "share_decoder_embeddings: expected true or false"),
    ("dropout", -0.1, "dropout: must not be negative, got -0.1"),
    ("model_type", 3, "model_type: expected text, got 3"),
])
def test_config_values_of_the_wrong_kind_or_range_are_refused(toy_task, key, value, message):
    config, _ = toy_task(**{"train_steps": 1, key: value})
    with pytest.raises(ValueError, match=re.escape(message)):
        train(config, progress=False)


# -- the raw-text recipe: sentencepiece on the fly, one vocabulary and embedding ---------------
RAW_RECIPE = os.path.join(ROOT, "configs", "transformer_multi30k_raw.yaml")


def test_the_raw_text_recipe_trains_on_pieces_and_its_checkpoint_names_the_transform(
        toy_task, tmp_path, caplog):
    import shutil

    import sentencepiece
    import yaml
    with open(RAW_RECIPE, encoding="utf-8") as f:
        recipe = yaml.safe_load(f)
    assert recipe["transforms"] == ["sentencepiece"] and os.path.isfile(
        os.path.join(ROOT, recipe["src_subword_model"]))
    keys = SHAPE_KEYS + ("share_embeddings", "share_vocab", "transforms")
    spm = str(tmp_path / "pieces.spm")
    config, _ = toy_task(**{key: recipe[key] for key in keys}, src_subword_model=spm,
                         tgt_subword_model=spm, train_steps=4, report_every=2, valid_steps=4,
                         threads=2, save_model=str(tmp_path / "run" / "model"))
    corpus = config["data"]["corpus_1"]
    sentencepiece.SentencePieceTrainer.train(  # a joint model of the toy corpus, as the recipe's
        input=f"{corpus['path_src']},{corpus['path_tgt']}", model_prefix=str(tmp_path / "p"),
        vocab_size=40, model_type="unigram", character_coverage=1.0, minloglevel=2)
    os.replace(tmp_path / "p.model", spm)
    last = train(config, progress=False)
    ckpt = load_checkpoint(last)
    assert ckpt.opt["transforms"] == ["sentencepiece"] and ckpt.opt["src_subword_model"] == spm
    assert ckpt.src_vocab.itos == ckpt.tgt_vocab.itos  # one vocabulary of both sides' pieces
    pieces = sentencepiece.SentencePieceProcessor(model_file=spm)
    assert set(pieces.encode("two seven", out_type=str)) <= set(ckpt.src_vocab.stoi)
    assert set(pieces.encode("TWO SEVEN", out_type=str)) <= set(ckpt.src_vocab.stoi)
    model, _ = load_model(last)
    assert model.encoder.embeddings.weight is model.decoder.embeddings.weight
    assert model.generator.weight is model.decoder.embeddings.weight
    # the checkpoint keeps its sentencepiece model: copied alone anywhere, it translates
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    shutil.copy(last, shipped / "model.pt")
    os.remove(spm)
    with caplog.at_level(logging.INFO, logger="onmt_lite"):
        translator = build_translator({"model": str(shipped / "model.pt"), "beam_size": 2,
                                       "max_length": 5})
    assert f"source model {shipped / 'model.pt'} ({spm})" in caplog.text
    (result,) = translator.translate(["two seven"])
    assert result.src_vocab == pieces.encode("two seven", out_type=str)  # pieces in, text out
    assert "\u2581" not in result.texts[0]
