"""translate.py: translate a file with an onmt_lite or OpenNMT-py checkpoint."""
import argparse
import contextlib
import logging
import math
import os
import sys
import tempfile
import time

import torch

from onmt_lite.checkpoint import CheckpointError
from onmt_lite.cli.options import add, parse_with_config
from onmt_lite.corpus import InputError
from onmt_lite.translate.attention_dump import attention_matrix, attention_record
from onmt_lite.translate.translator import build_translator

logger = logging.getLogger("onmt_lite")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="translate.py", description=__doc__)
    g = parser.add_argument_group("Model")
    add(g, "model", help="checkpoint (.pt): onmt_lite or OpenNMT-py 3.x")
    add(g, "config", help="YAML file of option values; the command line wins")
    g = parser.add_argument_group("Data")
    add(g, "src", help="source file, one tokenized sentence per line ('-': standard input)")
    add(g, "tgt", help="reference file: adds GOLD SCORE / GOLD PPL")
    add(g, "output", default="pred.txt", help="output file ('-': standard output)")
    add(g, "batch_size", type=int, default=30, help="sentences (or tokens) per batch")
    add(g, "batch_type", default="sents", choices=["sents", "tokens"],
        help="what -batch_size counts: sentences, or padded source tokens")
    add(g, "shard_size", type=int, default=10000,
        help="lines read, sorted and batched at a time (0: the whole input)")
    add(g, "src_seq_length_trunc", type=int, default=0,
        help="truncate longer source lines to this many tokens (0: only to the model's limit)")
    g = parser.add_argument_group("Beam search")
    add(g, "beam_size", type=int, default=5, help="1 = greedy search")
    add(g, "n_best", type=int, default=1, help="hypotheses written per input line")
    add(g, "min_length", type=int, default=0, help="minimum number of words")
    add(g, "max_length", type=int, default=250, help="maximum number of tokens")
    add(g, "max_length_ratio", type=float, default=1.25,
        help="limit to padded batch source length * ratio + 5 (0: off)")
    add(g, "beam_engine", default="batch", choices=["batch", "sentence"],
        help="batch: all sentences advance together; sentence: one Beam per sentence")
    add(g, "block_ngram_repeat", type=int, default=0, help="forbid repeating n-grams of this size")
    add(g, "ignore_when_blocking", nargs="+", default=[], help="tokens exempt from blocking")
    add(g, "replace_unk", action="store_true",
        help="replace <unk> by the source word with the highest attention")
    g = parser.add_argument_group("Penalties")
    add(g, "length_penalty", default="avg", choices=["none", "avg", "wu"])
    add(g, "alpha", type=float, default=1.0, help="length penalty strength")
    add(g, "coverage_penalty", default="none", choices=["none", "wu", "summary"])
    add(g, "beta", type=float, default=0.0, help="coverage penalty strength")
    add(g, "stepwise_penalty", action="store_true", help="apply the coverage penalty every step")
    g = parser.add_argument_group("Random sampling")
    add(g, "random_sampling_topk", type=int, default=0, help="sample among the k best (-1: all)")
    add(g, "random_sampling_topp", type=float, default=0.0, help="nucleus sampling mass")
    add(g, "random_sampling_temp", type=float, default=1.0, help="sampling temperature")
    add(g, "seed", type=int, default=-1, help="random seed (-1: unseeded)")
    g = parser.add_argument_group("Output and debugging")
    add(g, "with_score", action="store_true", help="append a tab and the score to each line")
    add(g, "verbose", action="store_true", help="log source, prediction and score per sentence")
    add(g, "attn_debug", action="store_true", help="log the attention matrix per sentence")
    add(g, "attn_dump", help="write source, prediction and attention as JSON lines")
    add(g, "report_time", action="store_true", help="log total time and tokens per second")
    g = parser.add_argument_group("Device")
    add(g, "gpu", type=int, default=-1, help="GPU id (-1: CPU)")
    add(g, "threads", type=int, default=0,
        help="torch intra-op threads (0: torch's default, shared among -inter_threads)")
    add(g, "inter_threads", type=int, default=1,
        help="batches translated at the same time, each on its own thread (same results)")
    add(g, "int8", action="store_true", help="CPU: dynamic int8 quantisation of linear layers")
    add(g, "precision", default="fp32", choices=["fp32", "fp16", "bf16"],
        help="fp16: GPU only; bf16: on GPU the whole model, on CPU the matrix products "
             "(weights stored in bf16; fast on CPUs with AMX or AVX-512 BF16)")
    return parser


def _summary(name: str, total: float, count: int) -> str:
    if count == 0:
        return f"{name} No translations"
    score = total / count
    try:
        ppl = math.exp(-score)
    except OverflowError:
        ppl = float("inf")
    return f"{name} SCORE: {score:.4f}, {name} PPL: {ppl:.2f} NB SENTENCES: {count}"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class AtomicOutput:
    """Writes to a temporary file beside the target and moves it into place only on success."""

    def __init__(self, path: str):
        self.path = path

    def __enter__(self):
        if self.path == "-":
            return sys.stdout
        folder = os.path.dirname(os.path.abspath(self.path))
        fd, self.tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-",
                                        suffix=os.path.basename(self.path))
        self.file = os.fdopen(fd, "w", encoding="utf-8")
        return self.file

    def __exit__(self, exc_type, exc, tb):
        if self.path == "-":
            sys.stdout.flush()
            return False
        self.file.close()
        if exc_type is None:
            os.chmod(self.tmp, 0o666 & ~_umask())
            os.replace(self.tmp, self.path)
        else:
            os.remove(self.tmp)
        return False


def run(args) -> None:
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    elif args.inter_threads > 1:
        torch.set_num_threads(max(1, torch.get_num_threads() // args.inter_threads))
    translator = build_translator(vars(args))
    start = time.time()
    pred_total = gold_total = 0.0
    count = words = 0
    dump_file = AtomicOutput(args.attn_dump) if args.attn_dump else contextlib.nullcontext()
    with AtomicOutput(args.output) as out, dump_file as dump:
        for trans in translator.translate_iter(args.src, args.tgt, args.batch_size,
                                               not args.verbose, args.batch_type,
                                               args.shard_size):
            out.write("".join(line + "\n" for line in trans.output_lines(args.with_score)))
            count += 1
            pred_total += trans.scores[0]
            words += len(trans.preds[0])
            if trans.gold_score is not None:
                gold_total += trans.gold_score
            if args.verbose:
                logger.info(trans.log(count))
            if args.attn_debug:
                logger.info("\n" + attention_matrix(trans.src_vocab, trans.preds[0] + ["</s>"],
                                                    trans.attns[0]))
            if args.attn_dump:
                pred = trans.preds[0] + (["</s>"] if len(trans.attns[0]) > len(trans.preds[0]) else [])
                dump.write(attention_record(trans.index, trans.src, pred, trans.attns[0]) + "\n")
    elapsed = time.time() - start
    logger.info(_summary("PRED", pred_total, count))
    if args.tgt:
        logger.info(_summary("GOLD", gold_total, count))
    if args.report_time:
        logger.info("Total translation time (s): %.3f", elapsed)
        logger.info("Average translation time (ms): %.1f", elapsed / max(count, 1) * 1000)
        logger.info("Tokens per second: %.1f", words / max(elapsed, 1e-9))


def main(argv=None) -> int:
    parser = build_parser()
    args = parse_with_config(parser, argv)
    if not args.model or not args.src:
        parser.error("-model and -src are required (on the command line or in -config)")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="[%(asctime)s %(levelname)s] %(message)s")
    try:
        run(args)
    except (CheckpointError, InputError, ValueError) as err:
        print(f"translate.py: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
