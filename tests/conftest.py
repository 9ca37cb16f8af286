"""Shared fixtures: tiny vocabularies, tiny seeded models of every kind, a toy training task."""
import os
import random

import pytest
import torch
import yaml

from onmt_lite.checkpoint import save_checkpoint
from onmt_lite.constants import SPECIALS
from onmt_lite.models import build_model
from onmt_lite.train.trainer import train
from onmt_lite.vocab import Vocab

torch.set_num_threads(1)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_FIXTURES = os.path.join(ROOT, "..", "shared", "fixtures", "onmt-py")

# Source and target vocabularies of different sizes, so a swapped pair does not go unnoticed.
SRC_WORDS = ["a", "b", "c", "d", "e", "f"]
TGT_WORDS = ["A", "B", "C", "D", "E", "F", "G"]

TINY_TRANSFORMER = {
    "model_type": "transformer", "enc_layers": 2, "dec_layers": 2, "hidden_size": 16,
    "word_vec_size": 16, "heads": 2, "transformer_ff": 32, "dropout": 0.0,
    "attention_dropout": 0.0,
}


def tiny_rnn(rnn_type: str, encoder_type: str, attention: str) -> dict:
    return {"model_type": "rnn", "rnn_type": rnn_type, "encoder_type": encoder_type,
            "global_attention": attention, "enc_layers": 2, "dec_layers": 2,
            "hidden_size": 16, "word_vec_size": 12, "dropout": 0.0}


TINY_RNNS = {
    f"{enc}-{rnn}-{attn}": tiny_rnn(rnn, enc, attn)
    for rnn, enc in (("LSTM", "brnn"), ("GRU", "rnn"))
    for attn in ("dot", "general", "mlp")
}
TINY_MODELS = {"transformer": TINY_TRANSFORMER, **TINY_RNNS}


def make_model(opt: dict, src_vocab: Vocab, tgt_vocab: Vocab, seed: int = 0):
    """A seeded model in eval mode."""
    torch.manual_seed(seed)
    model = build_model(opt, len(src_vocab), len(tgt_vocab), src_vocab.pad, tgt_vocab.pad)
    return model.eval()


def tiny_checkpoint(path, seed: int = 0, opt: dict = TINY_TRANSFORMER) -> str:
    """Saves a tiny seeded model (the Transformer by default), with the tiny vocabularies, as
    a checkpoint file."""
    src_vocab, tgt_vocab = Vocab(list(SPECIALS) + SRC_WORDS), Vocab(list(SPECIALS) + TGT_WORDS)
    save_checkpoint(str(path), make_model(opt, src_vocab, tgt_vocab, seed),
                    src_vocab, tgt_vocab, opt)
    return str(path)


@pytest.fixture
def src_vocab() -> Vocab:
    return Vocab(list(SPECIALS) + SRC_WORDS)


@pytest.fixture
def tgt_vocab() -> Vocab:
    return Vocab(list(SPECIALS) + TGT_WORDS)


@pytest.fixture(params=list(TINY_MODELS), ids=list(TINY_MODELS))
def model_case(request, src_vocab, tgt_vocab):
    """(name, options, model) for the Transformer and each RNN variant."""
    opt = TINY_MODELS[request.param]
    return request.param, opt, make_model(opt, src_vocab, tgt_vocab)


@pytest.fixture(params=["transformer", "brnn-LSTM-general"])
def model_type_case(request, src_vocab, tgt_vocab):
    """(name, options, model) for one model of each model_type."""
    opt = TINY_MODELS[request.param]
    return request.param, opt, make_model(opt, src_vocab, tgt_vocab)


@pytest.fixture
def transformer_model(src_vocab, tgt_vocab):
    return make_model(TINY_TRANSFORMER, src_vocab, tgt_vocab)


@pytest.fixture
def rnn_model(src_vocab, tgt_vocab):
    return make_model(TINY_RNNS["brnn-LSTM-general"], src_vocab, tgt_vocab)


@pytest.fixture
def checkpoint_path(tmp_path) -> str:
    return str(tmp_path / "model.pt")


@pytest.fixture
def padded_batch(src_vocab, tgt_vocab):
    """Sources of lengths 5, 3, 4 padded to 5 and target prefixes of length 4 (with <s>)."""
    torch.manual_seed(1)
    src_len = torch.tensor([5, 3, 4])
    src = torch.randint(4, len(src_vocab), (3, 5))
    for row, n in enumerate(src_len.tolist()):
        src[row, n:] = src_vocab.pad
    tgt = torch.randint(4, len(tgt_vocab), (3, 4))
    tgt[:, 0] = tgt_vocab.bos
    return src, src_len, tgt


# -- the toy training task -----------------------------------------------------------------
TOY_WORDS = "zero one two three four five six seven eight nine".split()

TOY_TRAIN = {
    "batch_size": 64, "valid_batch_size": 512, "vocab_size_multiple": 1,
    "decay_method": "none", "adam_beta2": 0.999,
    "label_smoothing": 0.0, "param_init_glorot": True, "report_every": 1000,
    "seed": 1234,
}
TOY_MODELS = {
    "transformer": {"model_type": "transformer", "enc_layers": 1, "dec_layers": 1,
                    "hidden_size": 32, "word_vec_size": 32, "heads": 2, "transformer_ff": 64,
                    "dropout": 0.0, "attention_dropout": 0.0, "learning_rate": 0.003},
    "rnn": {"model_type": "rnn", "encoder_type": "brnn", "rnn_type": "LSTM", "enc_layers": 1,
            "dec_layers": 1, "hidden_size": 32, "word_vec_size": 16,
            "global_attention": "general", "dropout": 0.0, "learning_rate": 0.01},
}


def toy_pairs(n: int, seed: int):
    """A copy task: the target is the source with every word upper-cased."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        words = [rng.choice(TOY_WORDS) for _ in range(rng.randint(2, 5))]
        pairs.append((" ".join(words), " ".join(words).upper()))
    return pairs


def write_toy_task(folder, model: str = "transformer", **overrides):
    """Writes train/valid files and a YAML config into ``folder``; returns (config, path)."""
    folder = str(folder)
    files = {}
    for name, n, seed in (("train", 400, 1), ("valid", 40, 2)):
        pairs = toy_pairs(n, seed)
        for side, column in (("src", 0), ("tgt", 1)):
            path = os.path.join(folder, f"{name}.{side}")
            with open(path, "w", encoding="utf-8") as f:
                f.write("".join(p[column] + "\n" for p in pairs))
            files[name, side] = path
    config = {
        "data": {
            "corpus_1": {"path_src": files["train", "src"], "path_tgt": files["train", "tgt"]},
            "valid": {"path_src": files["valid", "src"], "path_tgt": files["valid", "tgt"]},
        },
        "save_model": os.path.join(folder, "run", "model"),
        **TOY_TRAIN, **TOY_MODELS[model], **overrides,
    }
    os.makedirs(os.path.join(folder, "run"), exist_ok=True)
    config_path = os.path.join(folder, "config.yaml")
    with open(config_path, "w", encoding="utf-8") as f:
        yaml.safe_dump(config, f)
    return config, config_path


@pytest.fixture
def toy_task(tmp_path):
    """A function (model="transformer", **overrides) -> (config dict, YAML path) in tmp_path."""
    def make(model: str = "transformer", **overrides):
        return write_toy_task(tmp_path, model, **overrides)
    return make


@pytest.fixture(scope="session")
def toy_task_factory():
    """write_toy_task itself, for module-scoped fixtures that train once."""
    return write_toy_task


# -- a tiny trained model for the command-line tests ------------------------------------------
WORDS = ["red", "blue", "green", "cat", "dog", "bird", "runs", "sits", "big", "small"]
# The toy task: German-ish "translation" = the same words upper-cased.


def _lines(rng, n):
    src = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6))) for _ in range(n)]
    return src, [line.upper() for line in src]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A tiny Transformer trained for a few hundred steps on the upper-casing task."""
    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("tiny")
    rng = random.Random(7)
    for name, n in (("train", 2000), ("valid", 50)):
        src, tgt = _lines(rng, n)
        (folder / f"{name}.src").write_text("\n".join(src) + "\n")
        (folder / f"{name}.tgt").write_text("\n".join(tgt) + "\n")
    config = {
        "data": {"corpus_1": {"path_src": str(folder / "train.src"),
                              "path_tgt": str(folder / "train.tgt")},
                 "valid": {"path_src": str(folder / "valid.src"),
                           "path_tgt": str(folder / "valid.tgt")}},
        "model_type": "transformer", "enc_layers": 1, "dec_layers": 1, "hidden_size": 32,
        "word_vec_size": 32, "heads": 2, "transformer_ff": 64, "dropout": 0.0,
        "attention_dropout": 0.0, "batch_size": 400, "train_steps": 300, "valid_steps": 300,
        "save_checkpoint_steps": 300, "learning_rate": 2.0, "warmup_steps": 100,
        "save_model": str(folder / "model"), "report_every": 100,
    }
    return train(config, progress=False)
