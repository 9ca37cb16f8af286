"""translate.py: translate a file with an onmt_lite or OpenNMT-py checkpoint.

Options and files are checked before torch is imported (1.5-2 s): a refused command is said at
once. What decodes is imported by ``run``.
"""
import contextlib
import itertools
import json
import logging
import math
import os
import stat
import sys
import time

from tqdm.contrib.logging import logging_redirect_tqdm

from onmt_lite.cli.signals import Stopped, stop_on_signals
from onmt_lite.corpus import InputError
from onmt_lite.errors import CheckpointError, OptionError, WorkerError
from onmt_lite.journal import Journal, JournalError
from onmt_lite.options import parse_with_config
from onmt_lite.output import OutputError, OutputFile, check_output, is_atomic, same_file
from onmt_lite.translate import distributed
from onmt_lite.translate.attention_plot import plot_attention, plot_path, prepare_folder
from onmt_lite.translate.flags import build_parser

logger = logging.getLogger("onmt_lite")


def _summary(name: str, total: float, count: int) -> str:
    if count == 0:
        return f"{name} No translations"
    score = total / count
    try:
        ppl = math.exp(-score)
    except OverflowError:
        ppl = float("inf")
    return f"{name} SCORE: {score:.4f}, {name} PPL: {ppl:.2f} NB SENTENCES: {count}"


def _shows_progress(args) -> bool:
    """A progress bar on a terminal, or where asked for; never with -no_progress."""
    return not args.no_progress and (args.progress or sys.stderr.isatty())


# options that do not change the output: a resumed run may change them
RESUMABLE_CHANGES = {"src", "tgt", "output", "resume", "progress", "no_progress", "report_time",
                     "threads", "inter_threads", "workers", "config", "gpu", "given_options",
                     "compile_cache"}


# options that name a file or folder: an empty value is refused, not taken for "not given"
PATH_OPTIONS = ("model", "src", "tgt", "output", "attn_dump", "attn_plot", "config")


def _check_options(args) -> None:
    """Refuses, before the model loads, empty paths and what -resume cannot do (OptionError)."""
    for name in PATH_OPTIONS:
        value = getattr(args, name)
        if value == "" or (isinstance(value, list) and "" in value):
            raise OptionError(f"-{name}: the path is empty")
    if not args.resume:
        return
    for name in ("attn_dump", "attn_plot", "attn_debug", "verbose"):
        if getattr(args, name):
            raise OptionError(f"-resume: -{name} is not kept in the journal; run without -resume")
    if args.output == "-":
        raise OptionError("-resume keeps its journal beside -output: give a file, not -")
    for name in ("src", "tgt"):  # hashed for the journal, then read again to translate
        path = getattr(args, name)
        if path == "-" or (path is not None and os.path.exists(path)
                           and not stat.S_ISREG(os.stat(path).st_mode)):
            raise OptionError(f"-resume reads -{name} twice (its SHA-256 for the journal, "
                              f"then its lines): give a regular file, not {path}")


def _check_overwrites(args) -> None:
    """Refuses an output file that is also an input of the run or another of its outputs (the
    source replaced by its translation, the dump lost under the output). Files written through
    (FIFOs, devices) are the user's to share."""
    inputs = [(f"-{name}", getattr(args, name)) for name in
              ("src", "tgt", "config", "phrase_table", "src_subword_model", "tgt_subword_model")]
    inputs += [("-model", path) for path in args.model]
    outputs = [("-output", args.output, "-output"), ("-attn_dump", args.attn_dump, "-attn_dump")]
    if args.resume:
        outputs.append(("the -resume journal", f"{args.output}.journal", "-output"))
    if args.output == "-" and args.attn_dump == "-":
        raise OptionError("-attn_dump - and -output - would both write standard output; "
                          "give -attn_dump a file")
    written = []
    for label, path, option in outputs:
        if path and is_atomic(path):
            for other, given in written + inputs:
                if given and same_file(path, given):
                    raise OptionError(f"{label} {path} is the same file as {other} {given}; "
                                      f"give another {option}")
            written.append((label, path))


def run(args) -> None:
    import torch

    from onmt_lite.translate.build import build_translator
    if args.inter_threads == 0 and (args.threads > 0 or args.workers > 1):
        args.inter_threads = 1  # a thread layout asked for: one batch at a time in a process
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    elif args.inter_threads > 1:
        torch.set_num_threads(max(1, torch.get_num_threads() // args.inter_threads))
    reads_attention = args.replace_unk or args.attn_debug or args.attn_dump or args.attn_plot
    translator = build_translator(dict(vars(args), keep_attention=bool(reads_attention)))
    writes = translator.rank == 0  # under torchrun, rank 0 writes and logs (distributed.py)
    start = time.time()
    if args.resume:
        totals = _run_journaled(args, translator, writes)
    else:
        totals = _run_plain(args, translator, writes)
    distributed.leave()
    if writes:
        _report(args, *totals, time.time() - start)


def _run_plain(args, translator, writes: bool):
    from onmt_lite.translate.attention_dump import attention_matrix, attention_record
    pred_total = gold_total = 0.0
    count = words = 0
    dump_file = OutputFile(args.attn_dump) if args.attn_dump and writes else \
        contextlib.nullcontext()
    out_file = OutputFile(args.output) if writes else contextlib.nullcontext()
    # log lines go above the progress bar, not onto its line
    with out_file as out, dump_file as dump, logging_redirect_tqdm():
        for trans in translator.translate_iter(args.src, args.tgt, args.batch_size,
                                               _shows_progress(args), args.batch_type,
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
            pred = trans.preds[0] + (["</s>"] if len(trans.attns[0]) > len(trans.preds[0]) else [])
            if args.attn_dump:
                dump.write(attention_record(trans.index, trans.src, pred, trans.attns[0]) + "\n")
            if args.attn_plot:
                plot_attention(trans.src, pred, trans.attns[0].tolist(),
                               plot_path(args.attn_plot, trans.index))
    return pred_total, gold_total, count, words


def _run_journaled(args, translator, writes: bool):
    """-resume: batches already in the journal are not decoded again; each new one is
    journaled as it comes; the output is written in input order from both (journal.py)."""
    options = {k: v for k, v in vars(args).items() if k not in RESUMABLE_CHANGES}
    options = json.loads(json.dumps(options))
    if translator.world_size > 1 and not writes:  # torchrun: rank 0 makes the journal first
        distributed.barrier()
    journal = Journal(args.output, args.src, args.tgt, options, writes, args.shard_size)
    if translator.world_size > 1 and writes:
        distributed.barrier()
    if journal.done and writes:
        logger.info("%s: %d batches (%d lines) done before, not decoded again", journal.path,
                    len(journal.done), journal.lines_done)
    pending, next_out = {}, 0
    loaded = set()  # shards whose journaled records are in pending
    pred_total = gold_total = 0.0
    count = words = 0
    out_file = OutputFile(args.output) if writes else contextlib.nullcontext()
    with out_file as out, logging_redirect_tqdm():
        batches = translator.numbered_batches(
            args.src, args.tgt, args.batch_size, _shows_progress(args),
            batch_type=args.batch_type, shard_size=args.shard_size, skip=frozenset(journal.done))
        for number, translations in itertools.chain(batches, [(None, [])]):
            if number is not None:
                records = [_record(t, args.with_score) for t in translations]
                journal.add(number, records)
                pending.update((r["index"], r) for r in records)
            while True:
                if journal.shard(next_out) not in loaded:
                    loaded.add(journal.shard(next_out))
                    pending.update(journal.records_of(journal.shard(next_out)))
                if next_out not in pending:
                    break
                record = pending.pop(next_out)
                next_out += 1
                out.write("".join(line + "\n" for line in record["lines"]))
                count, pred_total, words = count + 1, pred_total + record["score"], \
                    words + record["words"]
                gold_total += record["gold"] or 0.0
    if writes and pending:
        raise RuntimeError(f"{journal.path}: lines {sorted(pending)[:3]}... came after a gap")
    journal.remove()  # the output is in place
    return pred_total, gold_total, count, words


def _record(trans, with_score: bool) -> dict:
    return {"index": trans.index, "lines": trans.output_lines(with_score),
            "score": trans.scores[0], "words": len(trans.preds[0]), "gold": trans.gold_score}


def _report(args, pred_total, gold_total, count, words, elapsed) -> None:
    logger.info(_summary("PRED", pred_total, count))
    if args.tgt and not args.tgt_file_prefix:  # as OpenNMT-py: the references are prefixes
        logger.info(_summary("GOLD", gold_total, count))
    if args.report_time:
        logger.info("Total translation time (s): %.3f", elapsed)
        logger.info("Average translation time (ms): %.1f", elapsed / max(count, 1) * 1000)
        logger.info("Tokens per second: %.1f", words / max(elapsed, 1e-9))


def main(argv=None) -> int:
    parser = build_parser()
    args = parse_with_config(parser, argv)
    if not args.model or args.src is None:
        parser.error("-model and -src are required (on the command line or in -config)")
    if args.progress and args.no_progress:
        parser.error("-progress and -no_progress exclude each other")
    rank = distributed.world()[0]  # under torchrun, rank 0 logs and writes
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.ERROR, stream=sys.stderr,
                        format="[%(asctime)s %(levelname)s] %(message)s")
    try:
        with stop_on_signals():
            _check_options(args)  # before the model loads
            if rank == 0:  # the files rank 0 writes
                _check_overwrites(args)
                for path in (args.output, args.attn_dump):
                    if path:
                        check_output(path)
            if args.attn_plot and rank == 0:
                prepare_folder(args.attn_plot)
            run(args)
    except Stopped as stop:
        kept = f"; {args.output} is left as it was" if is_atomic(args.output) else ""
        if args.resume and args.output != "-":
            kept += f"; -resume goes on from {args.output}.journal"
        print(f"translate.py: stopped by {stop.name}{kept}", file=sys.stderr)
        return stop.exit_status
    except OptionError as err:  # a refused option or combination: as argparse's own errors
        print(f"translate.py: error: {err}", file=sys.stderr)
        return 2
    except (CheckpointError, InputError, JournalError, OutputError, ValueError,
            WorkerError) as err:
        print(f"translate.py: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
