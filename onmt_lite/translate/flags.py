"""The options of translate.py: its parser, which ``onmt_lite serve`` also reads for a model's
decoding options (``-model``, conf.json's ``opt``)."""
import argparse

from onmt_lite.constants import INT8_ENGINES
from onmt_lite.options import Parser, add, integer, number

DESCRIPTION = "translate.py: translate a file with an onmt_lite or OpenNMT-py checkpoint."


def build_parser() -> argparse.ArgumentParser:
    """translate.py's parser: one argument group a function, in the order of -h."""
    parser = Parser(prog="translate.py", description=DESCRIPTION)
    for title, options in GROUPS:
        options(parser.add_argument_group(title))
    return parser


def _model(g) -> None:
    add(g, "model", nargs="+",
        help="checkpoint (.pt): onmt_lite or OpenNMT-py 3.x, or a Marian directory; several "
             "checkpoints with one vocabulary decode as an ensemble")
    add(g, "avg_raw_probs", action="store_true",
        help="an ensemble averages the exponentials of the models' logits (default: the "
             "logits), as OpenNMT-py does")
    add(g, "config", help="YAML file of option values; the command line wins")


def _data(g) -> None:
    add(g, "src", help="source file, one tokenized sentence per line ('-': standard input)")
    add(g, "tgt", help="reference file: adds GOLD SCORE / GOLD PPL")
    add(g, "output", default="pred.txt", help="output file ('-': standard output)")
    add(g, "batch_size", type=integer(1), default=30,
        help="sentences (or tokens) per batch")
    add(g, "batch_type", default="sents", choices=["sents", "tokens"],
        help="what -batch_size counts: sentences, or padded source tokens")
    add(g, "resume", action="store_true",
        help="keep a journal of the decoded batches beside -output (OUTPUT.journal), and "
             "continue from it: a run stopped at any point resumes where it stopped")
    add(g, "shard_size", type=integer(0), default=10000,
        help="lines read, sorted and batched at a time (0: the whole input)")
    add(g, "split_sentences", metavar="LANG", default="",
        help="each line is a paragraph in language LANG (such as en): its sentences, cut as "
             "LibreTranslate cuts them (spaCy's sentencizer), translated and joined; one output "
             "line per input line (needs the sentences extra: spaCy)")
    add(g, "src_seq_length_trunc", type=integer(0), default=0,
        help="truncate longer source lines to this many tokens (0: only to the model's limit)")


def _subword_transforms(g) -> None:
    add(g, "transforms", nargs="*",
        choices=["sentencepiece", "onmt_tokenize", "bpe", "filtertoolong"],
        help="raw text in and out through these transforms (not given: the checkpoint's own, "
             "when its model files exist; none: whitespace-split tokens)")
    add(g, "src_subword_model",
        help="subword model of the source side: sentencepiece model or BPE codes file")
    add(g, "tgt_subword_model",
        help="subword model of the target side: sentencepiece model or BPE codes file")
    for side, name in (("src", "source"), ("tgt", "target")):
        add(g, f"{side}_subword_type", choices=["none", "sentencepiece", "bpe"],
            help=f"onmt_tokenize: what -{side}_subword_model is (not given: none)")
        add(g, f"{side}_onmttok_kwargs",
            help=f"onmt_tokenize: the other pyonmttok.Tokenizer arguments of the {name} side, "
                 "a Python dict such as \"{'mode': 'aggressive', 'joiner_annotate': True}\" "
                 "(not given: {'mode': 'none'})")


def _beam_search(g) -> None:
    add(g, "search", default="onmt", choices=["onmt", "hf", "fairseq", "ctranslate2", "tf"],
        help="whose beam search, with its meaning of the shared flags: onmt (OpenNMT-py), "
             "hf (Hugging Face generate), fairseq, ctranslate2, or tf (TensorFlow official "
             "models); see docs/search.md")
    add(g, "beam_size", type=integer(1), default=5, help="1 = greedy search")
    add(g, "n_best", type=integer(1), default=1,
        help="hypotheses written per input line (at most -beam_size)")
    add(g, "min_length", type=integer(0), default=0, help="minimum number of words")
    add(g, "max_length", type=integer(1), default=250, help="maximum number of tokens")
    add(g, "max_length_ratio", type=number(0), default=1.25,
        help="limit to padded batch source length * ratio + 5 (0: off)")
    add(g, "beam_engine", default="batch", choices=["batch", "sentence"],
        help="batch: all sentences advance together; sentence: one Beam per sentence")
    add(g, "block_ngram_repeat", type=integer(0), default=0,
        help="forbid repeating n-grams of this size (0: off)")
    add(g, "ignore_when_blocking", nargs="+", default=[], help="tokens exempt from blocking")
    add(g, "replace_unk", action="store_true",
        help="replace <unk> by the source word with the highest attention")
    add(g, "phrase_table", default="",
        help="with -replace_unk: a file of 'source|||target' lines; a replaced <unk> becomes "
             "the target of the last line that starts with its source word")
    add(g, "ban_unk_token", action="store_true", help="never generate <unk>")
    add(g, "ratio", type=number(0), default=0.0,
        help="OpenNMT-py's legacy stop rule: a sentence stops when its best running score "
             "per expected token (source length x ratio) cannot beat its best finished one "
             "(0: off)")
    add(g, "tgt_file_prefix", action="store_true",
        help="force each -tgt line as the start of its translation, then search on")
    g.add_argument("-tgt_prefix", "--tgt_prefix", dest="tgt_file_prefix", action="store_true",
                   help="the same as -tgt_file_prefix")
    add(g, "early_stopping", default="false", choices=["true", "false", "never"],
        help="-search hf: stop a sentence when -beam_size hypotheses are finished (true), when "
             "no running one can beat them (false), or bound that at -max_length (never)")
    add(g, "patience", type=number(above=0), default=1.0,
        help="-search ctranslate2: a sentence ends when round(-beam_size * patience) "
             "hypotheses are finished")
    add(g, "diverse_groups", type=integer(1), default=1,
        help="-search fairseq: diverse beam search with this many groups of hypotheses "
             "(fairseq's --diverse-beam-groups; 1: off)")
    add(g, "diverse_strength", type=number(), default=0.5,
        help="-search fairseq: what a token costs a group for each earlier group's candidate "
             "that chose it at the same step (--diverse-beam-strength)")
    add(g, "repetition_penalty", type=number(above=0), default=1.0,
        help="scores of tokens already in the hypothesis: times this when negative, divided "
             "when positive (Hugging Face's; 1: off)")
    add(g, "renormalize_logits", action="store_true",
        help="-search hf: log-softmax again after bans, minimum length and penalties")


def _penalties(g) -> None:
    add(g, "length_penalty", default="avg", choices=["none", "avg", "wu"],
        help="none, avg (length^alpha) or wu (((5 + length) / 6)^alpha)")
    add(g, "alpha", type=number(), default=1.0,
        help="length penalty strength (-search hf: generate's length_penalty)")
    add(g, "coverage_penalty", default="none", choices=["none", "wu", "summary"],
        help="penalty for source words the attention left uncovered")
    add(g, "beta", type=number(0), default=0.0, help="coverage penalty strength")
    add(g, "stepwise_penalty", action="store_true", help="apply the coverage penalty every step")


def _random_sampling(g) -> None:
    add(g, "random_sampling_topk", type=integer(-1), default=0,
        help="sample among the k best (-1: all; 0: no sampling)")
    add(g, "random_sampling_topp", type=number(0, 1), default=0.0,
        help="nucleus sampling mass (0: off)")
    add(g, "random_sampling_temp", type=number(above=0), default=1.0,
        help="sampling temperature")
    add(g, "seed", type=integer(-1), default=-1, help="random seed (-1: unseeded)")


def _output_and_debugging(g) -> None:
    add(g, "with_score", action="store_true", help="append a tab and the score to each line")
    add(g, "verbose", action="store_true", help="log source, prediction and score per sentence")
    add(g, "attn_debug", action="store_true", help="log the attention matrix per sentence")
    add(g, "attn_dump", help="write source, prediction and attention as JSON lines")
    add(g, "attn_plot", help="folder for one attention picture (PNG) per sentence; "
                             "needs matplotlib")
    add(g, "report_time", action="store_true", help="log total time and tokens per second")
    bar = g.add_mutually_exclusive_group()
    add(bar, "progress", action="store_true",
        help="show a progress bar even when standard error is not a terminal")
    add(bar, "no_progress", action="store_true", help="never show a progress bar")


def _device(g) -> None:
    add(g, "gpu", type=integer(-1), default=-1, help="GPU id (-1: CPU)")
    add(g, "threads", type=integer(0), default=0,
        help="torch intra-op threads (0: torch's default, shared among -inter_threads)")
    add(g, "workers", type=integer(1), default=1,
        help="batches decoded at the same time by this many processes (CPU) of one torch "
             "thread each, sharing the model's weights")
    add(g, "inter_threads", type=integer(0), default=0,
        help="batches translated at the same time, each on its own thread (same results); 0: "
             "with no -threads or -workers, one batch per core, each in a forked process of one "
             "torch thread, where the input has several batches, else one batch on every core")
    add(g, "int8", action="store_true", help="CPU: dynamic int8 quantisation of linear layers")
    add(g, "int8_engine", default="auto", choices=list(INT8_ENGINES),
        help="-int8: torch's kernels for the int8 products (fbgemm or onednn); auto: torch's "
             "default (fbgemm on x86)")
    add(g, "fast", action="store_true",
        help="the fast path: the Transformer decoder step with one product for queries, keys "
             "and values and short self-attentions without batched products (with -int8 the "
             "RNN's cells quantised too); results close to exact decoding, not equal")
    add(g, "compile", action="store_true",
        help="-fast with the Transformer's encoder and decoder step compiled ahead of time "
             "by AOTInductor, their weights frozen in, where a C++ compiler is found (else it says "
             "so and runs uncompiled); compiled once (1-2 minutes), then loaded from the "
             "cache")
    add(g, "compile_cache", default="",
        help="-compile: folder for the compiled code, reused by later runs (default: "
             "$TORCHINDUCTOR_CACHE_DIR, else ~/.cache/onmt_lite/compiled)")
    add(g, "precision", default="auto", choices=["auto", "fp32", "fp16", "bf16", "mixed"],
        help="fp16: GPU only; bf16: on GPU the whole model, on CPU the matrix products "
             "(weights stored in bf16; fast on CPUs with AMX or AVX-512 BF16); mixed: CPU, "
             "bf16 products in the encoder and decoder, the output layer's fp32; auto: mixed "
             "for -fast or -compile on a CPU with AMX (without -int8), else fp32")


# the argument groups of -h, in order
GROUPS = (("Model", _model), ("Data", _data), ("Subword transforms", _subword_transforms),
          ("Beam search", _beam_search), ("Penalties", _penalties),
          ("Random sampling", _random_sampling), ("Output and debugging", _output_and_debugging),
          ("Device", _device))
