"""The training loop: teacher forcing, label smoothing, warm-up schedule, validation, checkpoints."""
import glob
import logging
import math
import os
import random
import time
from typing import Optional

import torch
import torch.nn.functional as F
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from onmt_lite.checkpoint import build_from_checkpoint, load_checkpoint, save_checkpoint
from onmt_lite.corpus import read_parallel
from onmt_lite.errors import OptionError
from onmt_lite.models.model import MODEL_DEFAULTS, build_model
from onmt_lite.train.batching import collate, make_examples, token_batches
from onmt_lite.train.optim import build_optimizer, learning_rate
from onmt_lite.transforms import build_transform, read_subword_models, subword_model_files
from onmt_lite.vocab import Vocab

TRAIN_DEFAULTS = {
    "save_model": "model", "train_steps": 1000, "valid_steps": 500,
    "save_checkpoint_steps": 500, "keep_checkpoint": 5, "report_every": 50, "seed": 1234,
    "batch_size": 2048, "valid_batch_size": 2048, "max_len": 100,
    "src_words_min_frequency": 1, "tgt_words_min_frequency": 1,
    "src_vocab_size": 0, "tgt_vocab_size": 0, "vocab_size_multiple": 8,
    "optim": "adam", "adam_beta1": 0.9, "adam_beta2": 0.998, "learning_rate": 2.0,
    "decay_method": "noam", "warmup_steps": 4000, "label_smoothing": 0.1,
    "max_grad_norm": 0.0, "param_init": 0.0, "param_init_glorot": True,
    "train_from": None, "log_file": None, "threads": 0,
    # raw text: the corpus is split into pieces on the fly, and the checkpoint names the transform
    "transforms": [], "src_subword_model": None, "tgt_subword_model": None, "share_vocab": False,
}
logger = logging.getLogger("onmt_lite.train")


POSITIVE = ("train_steps", "valid_steps", "save_checkpoint_steps", "report_every", "batch_size",
            "valid_batch_size", "max_len", "vocab_size_multiple", "enc_layers", "dec_layers",
            "hidden_size", "word_vec_size", "heads", "transformer_ff")


NON_NEGATIVE = ("dropout", "attention_dropout", "norm_eps", "src_words_min_frequency",
                "tgt_words_min_frequency", "src_vocab_size", "tgt_vocab_size", "learning_rate",
                "warmup_steps", "label_smoothing", "max_grad_norm", "param_init", "threads",
                "adam_beta1", "adam_beta2")
AT_MOST_ONE = ("dropout", "attention_dropout", "label_smoothing")
BELOW_ONE = ("adam_beta1", "adam_beta2")  # torch's Adam refuses 1
CHOICES = {"decay_method": ("noam", "rsqrt", "none")}  # read at the first step: checked before
KINDS = {bool: ((bool,), "true or false"), int: ((int,), "an integer"),
         float: ((int, float), "a number"), str: ((str,), "text"), list: ((list,), "a list")}


def _check_kinds(config: dict) -> None:
    """Each value has its default's kind (an integer where the default is one, true/false for a
    flag); numbers are finite and in range. Raises OptionError naming the key."""
    defaults = {**MODEL_DEFAULTS, **TRAIN_DEFAULTS}
    for key, value in config.items():
        default = defaults.get(key)
        if default is None:  # "data", and the paths that default to None
            continue
        kinds, what = KINDS[type(default)]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise OptionError(f"{key}: expected {what}, got {value!r}")
        if isinstance(value, float) and not math.isfinite(value):  # nan passes every bound
            raise OptionError(f"{key}: must be a finite number, got {value}")
        if key in POSITIVE and value < 1:
            raise OptionError(f"{key}: must be at least 1, got {value}")
        if key in NON_NEGATIVE and value < 0:
            raise OptionError(f"{key}: must not be negative, got {value}")
        if key in AT_MOST_ONE and value > 1:
            raise OptionError(f"{key}: must be at most 1, got {value}")
        if key in BELOW_ONE and value >= 1:
            raise OptionError(f"{key}: must be less than 1, got {value}")
        if key in CHOICES and value not in CHOICES[key]:
            raise OptionError(f"{key}: must be one of {', '.join(CHOICES[key])}, got {value!r}")


def _data_paths(opt: dict, name: str):
    try:
        corpus = opt["data"][name]
        return corpus["path_src"], corpus["path_tgt"]
    except (KeyError, TypeError):
        raise OptionError(f"config lacks data.{name}.path_src / path_tgt") from None


def _init_params(model: torch.nn.Module, opt: dict) -> None:
    for p in model.parameters():
        if opt["param_init"] > 0:
            p.data.uniform_(-opt["param_init"], opt["param_init"])
        if opt["param_init_glorot"] and p.dim() > 1:
            torch.nn.init.xavier_uniform_(p)


def _loss(model, batch, smoothing: float, pad: int):
    """Summed label-smoothed loss, summed NLL and correct-token count of one batch."""
    memory, final = model.encode(batch.src, batch.src_len)
    model.decoder.init_state(batch.src_len, memory, final)
    out, _ = model.decoder(batch.tgt_in)
    logits = model.generator(out).float().view(-1, model.generator.out_features)
    gold = batch.tgt_out.reshape(-1)
    loss = F.cross_entropy(logits, gold, ignore_index=pad, reduction="sum",
                           label_smoothing=smoothing)
    with torch.no_grad():
        nll = F.cross_entropy(logits, gold, ignore_index=pad, reduction="sum")
        correct = (logits.argmax(-1).eq(gold) & gold.ne(pad)).sum()
    return loss, nll, correct


def validate(model, examples, src_vocab, tgt_vocab, batch_tokens: int, device) -> dict:
    """Loss per token (no smoothing), perplexity and accuracy on ``examples``."""
    was_training = model.training
    model.eval()
    total_nll, total_correct, total_tokens = 0.0, 0, 0
    with torch.inference_mode():
        for idx in token_batches(examples, batch_tokens):
            batch = collate(examples, idx, src_vocab, tgt_vocab).to(device)
            _, nll, correct = _loss(model, batch, 0.0, tgt_vocab.pad)
            total_nll += nll.item()
            total_correct += correct.item()
            total_tokens += batch.n_tokens
    model.train(was_training)
    xent = total_nll / max(total_tokens, 1)
    return {"xent": xent, "ppl": math.exp(min(xent, 100)),
            "acc": 100.0 * total_correct / max(total_tokens, 1)}


def _setup_logging(log_file: Optional[str]) -> Optional[logging.Handler]:
    """Logs to stderr (once) and to ``log_file``; returns the file handler to close at the end."""
    logger.setLevel(logging.INFO)
    form = logging.Formatter("[%(asctime)s %(levelname)s] %(message)s")
    if not any(type(h) is logging.StreamHandler for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(form)
        logger.addHandler(handler)
    if not log_file:
        return None
    handler = logging.FileHandler(log_file)
    handler.setFormatter(form)
    logger.addHandler(handler)
    return handler


def train(config: dict, device: str = "cpu", progress: bool = True) -> str:
    """Trains a model as ``config`` says (OpenNMT-py style keys); returns the last checkpoint path."""
    unknown = set(config) - set(TRAIN_DEFAULTS) - set(MODEL_DEFAULTS) - {"data"}
    if unknown:
        raise OptionError(f"unknown config keys: {', '.join(sorted(unknown))}")
    _check_kinds(config)
    opt = {**MODEL_DEFAULTS, **TRAIN_DEFAULTS, **config}
    for path in (opt["save_model"], opt["log_file"]):  # their folders, e.g. runs/transformer/
        if path and os.path.dirname(path):
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
            except OSError as err:
                raise ValueError(f"{os.path.dirname(path)}: cannot create: {err.strerror}") from None
    file_handler = _setup_logging(opt["log_file"])
    try:
        with logging_redirect_tqdm(loggers=[logger]):  # log lines above the bar, not on it
            return _train(opt, device, progress)
    finally:
        if file_handler is not None:
            logger.removeHandler(file_handler)
            file_handler.close()


def _train(opt: dict, device: str, progress: bool) -> str:
    if opt["threads"]:
        torch.set_num_threads(opt["threads"])
    random.seed(opt["seed"])
    torch.manual_seed(opt["seed"])
    rng = random.Random(opt["seed"])

    train_src, train_tgt = read_parallel(*_data_paths(opt, "corpus_1"))
    valid_src, valid_tgt = read_parallel(*_data_paths(opt, "valid"))
    transform = build_transform(lambda name: opt.get(name), {}, "")
    # every checkpoint keeps the subword models it was trained through: a model is one file
    kept = read_subword_models(subword_model_files(opt))
    if transform is not None:
        train_src, train_tgt, valid_src, valid_tgt = (
            [" ".join(transform.encode(line, side)) for line in lines] for lines, side in
            ((train_src, "src"), (train_tgt, "tgt"), (valid_src, "src"), (valid_tgt, "tgt")))
    if opt["train_from"]:
        ckpt = load_checkpoint(opt["train_from"])
        src_vocab, tgt_vocab = ckpt.src_vocab, ckpt.tgt_vocab
        model = build_from_checkpoint(ckpt, opt["train_from"])
        opt.update(ckpt.opt)
    else:
        ckpt = None
        if opt["share_vocab"]:  # one vocabulary of both sides' tokens, as OpenNMT-py's
            src_vocab = tgt_vocab = Vocab.build(
                train_src + train_tgt, opt["src_words_min_frequency"], opt["src_vocab_size"],
                opt["vocab_size_multiple"])
        else:
            src_vocab = Vocab.build(train_src, opt["src_words_min_frequency"],
                                    opt["src_vocab_size"], opt["vocab_size_multiple"])
            tgt_vocab = Vocab.build(train_tgt, opt["tgt_words_min_frequency"],
                                    opt["tgt_vocab_size"], opt["vocab_size_multiple"])
        try:
            model = build_model(opt, len(src_vocab), len(tgt_vocab), src_vocab.pad,
                                tgt_vocab.pad)
        except ValueError as err:  # the config's model settings: an unknown type, odd sizes
            raise OptionError(str(err)) from None
        _init_params(model, opt)
    model.to(device).train()
    optimizer = build_optimizer(model.parameters(), opt)
    step = 0
    if ckpt is not None and ckpt.train_state:
        optimizer.load_state_dict(ckpt.train_state["optim"])
        step = ckpt.train_state["step"]
        rng.seed(opt["seed"] + step)
    logger.info("vocab: %d source, %d target; %d parameters", len(src_vocab), len(tgt_vocab),
                sum(p.numel() for p in model.parameters()))

    train_ex = make_examples(train_src, train_tgt, src_vocab, tgt_vocab, opt["max_len"])
    valid_ex = make_examples(valid_src, valid_tgt, src_vocab, tgt_vocab, 10 ** 9)
    if not train_ex:
        raise ValueError(f"no training pair is non-empty and within max_len={opt['max_len']}")
    saved, path = [], None
    start, report = time.time(), {"loss": 0.0, "tokens": 0, "correct": 0}
    bar = tqdm(total=opt["train_steps"], initial=step, disable=not progress, desc="train")
    while step < opt["train_steps"]:
        for idx in token_batches(train_ex, opt["batch_size"], rng):
            if step >= opt["train_steps"]:
                break
            step += 1
            lr = learning_rate(step, opt["learning_rate"], opt["decay_method"],
                               opt["warmup_steps"], opt["hidden_size"])
            for group in optimizer.param_groups:
                group["lr"] = lr
            batch = collate(train_ex, idx, src_vocab, tgt_vocab).to(device)
            loss, nll, correct = _loss(model, batch, opt["label_smoothing"], tgt_vocab.pad)
            optimizer.zero_grad()
            (loss / batch.n_tokens).backward()
            if opt["max_grad_norm"] > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), opt["max_grad_norm"])
            optimizer.step()
            report["loss"] += nll.item()
            report["tokens"] += batch.n_tokens
            report["correct"] += correct.item()
            bar.update(1)
            if step % opt["report_every"] == 0:
                xent = report["loss"] / report["tokens"]
                logger.info("step %d/%d; acc %.2f; ppl %.2f; lr %.6f; %.0f s",
                            step, opt["train_steps"], 100 * report["correct"] / report["tokens"],
                            math.exp(min(xent, 100)), lr, time.time() - start)
                report = {"loss": 0.0, "tokens": 0, "correct": 0}
            if step % opt["valid_steps"] == 0 or step == opt["train_steps"]:
                stats = validate(model, valid_ex, src_vocab, tgt_vocab, opt["valid_batch_size"],
                                 device)
                logger.info("validation step %d: ppl %.3f; acc %.2f; xent %.4f; %.0f s",
                            step, stats["ppl"], stats["acc"], stats["xent"], time.time() - start)
            if step % opt["save_checkpoint_steps"] == 0 or step == opt["train_steps"]:
                path = f"{opt['save_model']}_step_{step}.pt"
                save_checkpoint(path, model, src_vocab, tgt_vocab, opt,
                                train_state={"step": step, "optim": optimizer.state_dict()},
                                subword_models=kept)
                logger.info("saved %s", path)
                saved.append(path)
                while opt["keep_checkpoint"] > 0 and len(saved) > opt["keep_checkpoint"]:
                    os.remove(saved.pop(0))
    bar.close()
    return path or opt["train_from"]


def average_checkpoints(paths, output: str, half: bool = False) -> None:
    """Writes the parameter average of several checkpoints of one model (no optimizer state)."""
    ckpts = [load_checkpoint(p) for p in paths]
    models = [build_from_checkpoint(c, p) for c, p in zip(ckpts, paths)]
    averaged = models[0]
    states = [m.state_dict() for m in models]
    avg = {k: sum(s[k].float() for s in states) / len(states) for k in states[0]}
    averaged.load_state_dict(avg)
    save_checkpoint(output, averaged, ckpts[0].src_vocab, ckpts[0].tgt_vocab, ckpts[0].opt,
                    half=half, subword_models=ckpts[0].subword_models)


def last_checkpoints(prefix: str, n: int):
    """The ``n`` latest ``<prefix>_step_N.pt`` files, oldest first."""
    found = glob.glob(f"{prefix}_step_*.pt")
    found.sort(key=lambda p: int(p.rsplit("_step_", 1)[1][:-3]))
    return found[-n:]
