"""Translator and build_translator: encode once, tile by beam_size, step, map_state."""
import argparse
import contextlib
import copy
import dataclasses
import itertools
import logging
import multiprocessing
import os
import queue
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generator, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from tqdm import tqdm

from onmt_lite import marian
from onmt_lite.checkpoint import CheckpointError, load_model
from onmt_lite.constants import EOS
from onmt_lite.corpus import InputError, lines_of
from onmt_lite.errors import OptionError
from onmt_lite.models.ensemble import EnsembleModel
from onmt_lite.models.model import for_inference, inference, replica
from onmt_lite.options import integer, number
from onmt_lite.search.beam import Beam
from onmt_lite.search.candidates import Sampler
from onmt_lite.search.finishing import EARLY_STOPPING, Hypothesis
from onmt_lite.search.global_scorer import COVERAGE_PENALTIES, LENGTH_PENALTIES, GNMTGlobalScorer
from onmt_lite.search.loop import run_to_end, search_steps
from onmt_lite.search.presets import LACKS, PRESETS, build_search
from onmt_lite.search.processors import BannedTokens, force_eos
from onmt_lite.transforms import (
    SubwordTransform,
    TransformError,
    TransformOptionError,
    build_transform,
)
from onmt_lite.translate.distributed import block, gather, join, local_rank, world
from onmt_lite.translate.translation import Translation
from onmt_lite.translate.workers import WorkerPool
from onmt_lite.vocab import unknown_tokens_warning

logger = logging.getLogger("onmt_lite")


@dataclass
class DecodingOptions:
    """Search settings; names and defaults follow OpenNMT-py's translate options."""
    beam_size: int = 5
    n_best: int = 1
    min_length: int = 0
    max_length: int = 250
    max_length_ratio: float = 1.25
    alpha: float = 1.0
    beta: float = 0.0
    length_penalty: str = "avg"
    coverage_penalty: str = "none"
    stepwise_penalty: bool = False
    block_ngram_repeat: int = 0
    ignore_when_blocking: Sequence[str] = ()
    replace_unk: bool = False
    random_sampling_topk: int = 0
    random_sampling_topp: float = 0.0
    random_sampling_temp: float = 1.0
    seed: int = -1
    src_seq_length_trunc: int = 0
    beam_engine: str = "batch"  # batch: search/loop.py; sentence: one Beam per sentence
    forced_eos: bool = False  # </s> is the only choice at max_length (Hugging Face's rule)
    search: str = "onmt"  # whose beam search: a name in search/presets.py
    early_stopping: str = "false"  # Hugging Face's stopping rule (-search hf)
    repetition_penalty: float = 1.0  # Hugging Face's (CTRL) repetition penalty; 1: off
    ban_unk_token: bool = False  # <unk> never generated
    ratio: float = 0.0  # OpenNMT-py's legacy stop rule (see OnmtSlots); 0: off
    phrase_table: str = ""  # with replace_unk: lines "source|||target" translate the word
    tgt_file_prefix: bool = False  # the -tgt lines are forced as prefixes, then search goes on
    patience: float = 1.0  # CTranslate2's: a sentence ends with round(beam * patience) finished
    diverse_groups: int = 1  # fairseq's diverse beam search: groups of hypotheses (1: off)
    diverse_strength: float = 0.5  # its Hamming diversity penalty
    banned_tokens: Sequence[int] = ()  # never generated (a Marian model's bad_words_ids)
    renormalize_logits: bool = False  # log-softmax after the processors (-search hf)
    keep_attention: bool = True  # each hypothesis' attention (Translation.attns); off: width 0

    def validate(self) -> None:
        """Raises OptionError naming the option of a value or combination that is refused."""
        check_numbers(vars(self))
        if self.n_best > self.beam_size:
            raise OptionError(f"-n_best must be between 1 and -beam_size ({self.beam_size})")
        for name, choices in (("beam_engine", ("batch", "sentence")), ("search", PRESETS),
                              ("early_stopping", EARLY_STOPPING),
                              ("length_penalty", LENGTH_PENALTIES),
                              ("coverage_penalty", COVERAGE_PENALTIES)):
            if getattr(self, name) not in choices:
                raise OptionError(f"-{name} must be one of {', '.join(choices)}")
        for name, off in LACKS.get(self.search, {}).items():
            if getattr(self, name) != off:
                raise OptionError(f"-{name}: -search {self.search} has no such setting")
        if self.search == "tf" and self.alpha < 0:
            raise OptionError("-search tf needs -alpha 0 or more (its stop rule assumes it)")
        if self.search != "onmt":
            for name, onmt_only in (("coverage_penalty", "none"), ("beam_engine", "batch"),
                                    ("stepwise_penalty", False), ("length_penalty", "avg"),
                                    ("ratio", 0.0)):
                if getattr(self, name) != onmt_only:
                    raise OptionError(f"-{name} is OpenNMT-py's: not available with "
                                      f"-search {self.search}")
        elif self.beam_engine == "sentence":
            for name in ("repetition_penalty", "ban_unk_token", "ratio", "tgt_file_prefix"):
                if getattr(self, name) != getattr(DecodingOptions, name):
                    raise OptionError(f"-{name} needs -beam_engine batch")
        if self.diverse_groups != 1:
            if self.search != "fairseq":
                raise OptionError("-diverse_groups: diverse beam search is fairseq's: give "
                                  "-search fairseq")
            if self.beam_size % self.diverse_groups:
                raise OptionError(f"-diverse_groups {self.diverse_groups} must divide "
                                  f"-beam_size {self.beam_size}")
        if self.tgt_file_prefix and self.search not in ("onmt", "ctranslate2"):
            raise OptionError(f"-tgt_file_prefix: -search {self.search} has no target prefix")
        if self.replace_unk and not self.keep_attention:
            raise OptionError("-replace_unk reads the attention: keep_attention must be on")
        sampling = self.random_sampling_topk != 0 or self.random_sampling_topp != 0
        if sampling and self.beam_size != 1 and self.search != "hf":
            raise OptionError("random sampling needs -beam_size 1 (or -search hf: beam "
                              "sampling)")


# the range of each number, as translate.py checks it: the Python API is checked alike
NUMBERS = {
    "beam_size": integer(1), "n_best": integer(1), "min_length": integer(0),
    "max_length": integer(1), "max_length_ratio": number(0), "alpha": number(),
    "beta": number(0), "block_ngram_repeat": integer(0), "random_sampling_topk": integer(-1),
    "random_sampling_topp": number(0, 1), "random_sampling_temp": number(above=0),
    "seed": integer(-1), "src_seq_length_trunc": integer(0), "ratio": number(0),
    "repetition_penalty": number(above=0), "patience": number(above=0),
    "diverse_groups": integer(1), "diverse_strength": number(),
    # of the Translator, build_translator and translate
    "batch_size": integer(1), "shard_size": integer(0), "gpu": integer(-1),
    "threads": integer(0), "inter_threads": integer(0), "workers": integer(1),
}


def check_numbers(values: dict) -> None:
    """Raises OptionError on a value of ``values`` (name: value) of the wrong kind or out of
    its range, NaN and infinities included."""
    for name, value in values.items():
        if name in NUMBERS:
            try:
                NUMBERS[name](value)
            except argparse.ArgumentTypeError as err:
                raise OptionError(f"-{name}: {err}") from None


class Translator:
    """Translates lines with an NMTModel and its vocabularies.

    Args:
        model: an NMTModel in eval mode; src_vocab / tgt_vocab: its vocabularies.
        options: the DecodingOptions; device: where the model lives.
        inter_threads: batches decoded at the same time, each by its own thread with its own
            decoder state (the weights are shared); results do not depend on it. 0: as the
            machine suits (see _forks and _side_by_side).
        workers: batches decoded at the same time by forked processes of one torch thread each
            (see workers.py); results are those of one process on one thread.
        transform: splits raw source lines into pieces and joins target pieces back into text
            (see transforms.py); None for whitespace-tokenized text.
    """

    beam_class = Beam

    def __init__(self, model, src_vocab, tgt_vocab, options: DecodingOptions = None,
                 device: str = "cpu", model_max_src_len: Optional[int] = None,
                 inter_threads: int = 1, transform: Optional[SubwordTransform] = None,
                 workers: int = 1):
        self.model, self.src_vocab, self.tgt_vocab = model, src_vocab, tgt_vocab
        self.transform = transform  # raw text <-> pieces; None: whitespace-split tokens
        self.opt = options or DecodingOptions()
        self.opt.validate()
        check_numbers({"inter_threads": inter_threads, "workers": workers})
        self.inter_threads = inter_threads
        self.cores = torch.get_num_threads()  # torch's default: one per core, or OMP_NUM_THREADS
        if workers > 1 and (inter_threads > 1 or device != "cpu"):
            raise OptionError("-workers decodes on CPU, without -inter_threads")
        self.workers = workers
        self.rank, self.world_size = world()  # under torchrun: this worker's share (see
        if self.world_size > 1:  # distributed.py); rank 0 yields every translation
            join(device != "cpu")
        self.device = device
        self.model_max_src_len = model_max_src_len
        self.preset = PRESETS[self.opt.search]
        self.phrase_table = read_phrase_table(self.opt.phrase_table)
        self.scorer = GNMTGlobalScorer(self.opt.alpha, self.opt.beta, self.opt.length_penalty,
                                       self.opt.coverage_penalty)
        self.exclusion = frozenset(tgt_vocab.stoi[t] for t in self.opt.ignore_when_blocking
                                   if t in tgt_vocab.stoi)
        self.sampler = None
        if self.opt.random_sampling_topk != 0 or self.opt.random_sampling_topp != 0:
            generator = torch.Generator(device=device)
            if self.opt.seed >= 0:
                generator.manual_seed(self.opt.seed)
            else:
                generator.seed()
            topk = self.opt.random_sampling_topk if self.opt.random_sampling_topk > 0 else 0
            self.sampler = Sampler(topk, self.opt.random_sampling_topp,
                                   self.opt.random_sampling_temp, generator)
            if inter_threads > 1 or workers > 1:  # they would draw from generators in turn
                raise OptionError("random sampling needs -inter_threads 1 and -workers 1 to "
                                  "be reproducible")

    # -- public API -----------------------------------------------------------------------
    def translate(self, src: Union[str, List[str]], tgt: Union[str, List[str], None] = None,
                  batch_size: int = 30, attn_debug: bool = False, progress: bool = False,
                  batch_type: str = "sents", shard_size: int = 10000) -> List[Translation]:
        """Translates a file path or a list of lines; results come back in input order.

        ``batch_size`` counts sentences, or with ``batch_type="tokens"`` padded source tokens.
        """
        return list(self.translate_iter(src, tgt, batch_size, progress, batch_type, shard_size))

    def translate_iter(self, src, tgt=None, batch_size: int = 30, progress: bool = False,
                       batch_type: str = "sents", shard_size: int = 10000) -> Iterator[Translation]:
        """Like translate, yielding each Translation in input order as soon as it is ready."""
        results, next_out = {}, 0
        for batch in self.translate_batches(src, tgt, batch_size, progress=progress,
                                            batch_type=batch_type, shard_size=shard_size):
            results.update((t.index, t) for t in batch)
            while next_out in results:
                yield results.pop(next_out)
                next_out += 1

    def translate_batches(self, src, tgt=None, batch_size: int = 30, progress: bool = False,
                          only: Optional[set] = None, batch_type: str = "sents",
                          shard_size: int = 10000) -> Iterator[List[Translation]]:
        """Translations batch by batch, in decoding order (see numbered_batches)."""
        for _, translations in self.numbered_batches(src, tgt, batch_size, progress, only,
                                                     batch_type, shard_size):
            yield translations

    def numbered_batches(self, src, tgt=None, batch_size: int = 30, progress: bool = False,
                         only: Optional[set] = None, batch_type: str = "sents",
                         shard_size: int = 10000, skip: frozenset = frozenset()
                         ) -> Iterator[Tuple[int, List[Translation]]]:
        """(batch number, its translations), batch by batch, in decoding order.

        Input is read as it goes, ``shard_size`` lines at a time (0: all at once); each shard's
        lines are sorted by length and cut into batches, so memory stays bounded on any input.

        Args:
            only: numbers of the batches to decode (default all): a subset decodes exactly as
                it would within the whole input.
            skip: numbers of batches not to decode (done before, see journal.py).
        """
        check_numbers({"batch_size": batch_size, "shard_size": shard_size})
        if batch_type not in ("sents", "tokens"):
            raise OptionError("-batch_type must be sents or tokens")
        if self.opt.tgt_file_prefix and tgt is None:
            raise OptionError("-tgt_file_prefix forces the -tgt lines: give -tgt")
        number, warned = 0, False
        show = progress and self.rank == 0
        with tqdm(disable=not show, total=_line_count(src) if show else None,
                  desc="translate", unit="sent", leave=False) as bar, \
                contextlib.ExitStack() as stack:
            processes = stack.enter_context(WorkerPool(self, self.workers)) \
                if self.workers > 1 else None
            for offset, src_lines, tgt_lines in _shards(src, tgt, shard_size):
                src_tokens = [self.source_tokens(line, offset + i)
                              for i, line in enumerate(src_lines, 1)]
                warning = None if warned else unknown_tokens_warning(self.src_vocab, src_tokens)
                if warning:
                    logger.warning(warning)
                    warned = True
                tgt_tokens = None if tgt is None else [
                    self.transform.encode(line, "tgt") if self.transform else line.split()
                    for line in tgt_lines]
                batches, numbers = [], []
                for indices in self._batches(src_tokens, tgt_tokens, batch_size, batch_type):
                    if number in skip:  # done before: counted as done at once
                        bar.update(len(indices))
                    elif only is None or number in only:
                        batches.append((indices, src_tokens, tgt_tokens, offset))
                        numbers.append(number)
                    number += 1
                if processes is None and self._forks(batches):
                    processes = stack.enter_context(WorkerPool(self, self.cores))
                if self.world_size > 1:  # torchrun: this rank's block, then rank 0 has all
                    mine = block(len(batches), self.rank, self.world_size)
                    decoded = list(self._run_batches([batches[i] for i in mine], processes))
                    decoded = gather(decoded, self.rank, self.world_size) or []
                else:
                    decoded = self._run_batches(batches, processes)
                for batch_number, translations in zip(numbers, decoded):
                    yield batch_number, translations
                    bar.update(len(translations))

    def _run_batches(self, batches: list, processes: Optional[WorkerPool] = None
                     ) -> Iterator[List[Translation]]:
        """_translate_batch on each argument tuple, in order, on ``inter_threads`` threads or
        the ``processes`` of -workers."""
        if processes is not None:
            yield from processes.map(batches)
            return
        inter_threads = self.inter_threads or self._side_by_side(batches)
        if inter_threads == 1:
            yield from (self._translate_batch(*args) for args in batches)
            return
        idle = queue.SimpleQueue()  # copies of this translator, each with its own decoder
        for _ in range(inter_threads):
            worker = copy.copy(self)
            worker.model = self.model.replica() if isinstance(self.model, EnsembleModel) \
                else replica(self.model)
            idle.put(worker)

        def run(args):
            worker = idle.get()
            try:
                return worker._translate_batch(*args)
            finally:
                idle.put(worker)

        pool = ThreadPoolExecutor(inter_threads)
        try:
            yield from pool.map(run, batches)
        finally:  # a consumer that stops early does not wait for the batches still queued
            pool.shutdown(cancel_futures=True)

    def _forks(self, batches: list) -> bool:
        """-inter_threads 0 and no -workers: whether several ``batches`` go to forked processes
        of one torch thread each (workers.py), one per core, for the rest of the run. Faster
        than threads wherever measured (the Python side of a step never waits for another
        thread's interpreter lock: 20% less time for a Transformer on an Intel Xeon, level on an
        AMD EPYC); forked after the first shard that has several batches is read. Not where
        the batches must decode in one process (random sampling, GPU, torchrun)."""
        return (self.inter_threads == 0 and self.workers == 1
                and self.sampler is None and self.device == "cpu" and self.world_size == 1
                and min(self.cores, len(batches)) > 1
                and "fork" in multiprocessing.get_all_start_methods())

    def _side_by_side(self, batches: list) -> int:
        """-inter_threads 0: how many ``batches`` to decode at a time, setting torch's
        intra-op threads to suit. Several batches go side by side, one per core, each on one
        torch thread: the fastest exact layout measured on every CPU, idle or busy, and one
        that never waits on OpenMP. A lone batch (a sentence from a pipe, a short file) gets
        one torch thread per core, at most one per sentence (one sentence's steps, beam 5, with
        OpenMP's passive waiting: 12% slower on two threads than on one for the Transformer
        fixture, level for the RNN, on an Intel Xeon)."""
        side_by_side = 1 if self.sampler is not None or self.device != "cpu" \
            or self.world_size > 1 else min(self.cores, len(batches))
        if side_by_side > 1:
            torch.set_num_threads(1)  # each pool thread takes this at its first product
        elif self.device == "cpu":
            sentences = max((len(indices) for indices, *_ in batches), default=1)
            torch.set_num_threads(max(1, min(self.cores, sentences)))
        return side_by_side

    def warm_up(self) -> None:
        """Decodes a batch of one sentence and one of two (source lengths 1 to 3): -compile
        compiles the step here, at load, rather than in the first batch."""
        word = self.src_vocab.itos[-1]
        lines = [[word], [word] * 2, [word] * 3]
        targets = lines if self.opt.tgt_file_prefix else None  # forced as prefixes
        generator = getattr(self.sampler, "generator", None)
        state = None if generator is None else generator.get_state()
        self._translate_batch([0], lines, targets)
        self._translate_batch([1, 2], lines, targets)
        if state is not None:  # a seeded run draws as it would without the warm-up
            generator.set_state(state)

    # -- batching -------------------------------------------------------------------------
    def source_tokens(self, line: str, number: int) -> List[str]:
        """Line ``number``'s tokens as the model reads them: through the transform (or split at
        whitespace), cut to -src_seq_length_trunc or the model's position table."""
        tokens = self.transform.encode(line) if self.transform else line.split()
        limit = self.opt.src_seq_length_trunc or self.model_max_src_len
        if limit and len(tokens) > limit:
            logger.warning("source line %d has %d tokens: truncated to %d", number,
                           len(tokens), limit)
            tokens = tokens[:limit]
        return tokens

    def empty_source(self, tokens: List[str]) -> bool:
        """A source with nothing to translate: no tokens; under -search ctranslate2 also a lone
        ``</s>`` (what a Marian tokenizer makes of an empty line), which CTranslate2 skips."""
        return not tokens or (self.opt.search == "ctranslate2" and tokens == [EOS])

    def _batches(self, src_tokens, tgt_tokens, batch_size: int, batch_type: str):
        """Sorts non-empty lines by length (stable; by (source, target) length with -tgt) and
        cuts consecutive batches, as OpenNMT-py does: ``batch_size`` sentences, or with
        ``tokens`` as many as keep sentences x the batch's longest line within ``batch_size``,
        a line's length being its source's or, with -tgt, its target's with <s> and </s> if
        longer (onmt/inputters/dynamic_iterator.py batch_iter, max_src_tgt)."""
        order = [i for i, toks in enumerate(src_tokens) if not self.empty_source(toks)]
        if tgt_tokens is None:
            order.sort(key=lambda i: len(src_tokens[i]))
        else:
            order.sort(key=lambda i: (len(src_tokens[i]), len(tgt_tokens[i]) + 2))

        def length(i: int) -> int:
            if batch_type != "tokens":
                return 1
            return len(src_tokens[i]) if tgt_tokens is None else max(len(src_tokens[i]),
                                                                      len(tgt_tokens[i]) + 2)
        batch: List[int] = []
        longest = 0
        for i in order:
            if batch and (len(batch) + 1) * max(longest, length(i)) > batch_size:
                yield batch
                batch, longest = [], 0
            batch.append(i)
            longest = max(longest, length(i))
        if batch:
            yield batch
        empties = [i for i, toks in enumerate(src_tokens) if self.empty_source(toks)]
        if empties:
            yield empties

    # -- one batch ------------------------------------------------------------------------
    @inference()
    def _translate_batch(self, indices: List[int], src_tokens, tgt_tokens,
                         offset: int = 0) -> List[Translation]:
        """Translates lines ``indices`` of a shard that starts at input line ``offset``."""
        return run_to_end(self.batch_steps(indices, src_tokens, tgt_tokens, offset))

    def batch_steps(self, indices: List[int], src_tokens, tgt_tokens, offset: int = 0,
                    shared: bool = False, join: bool = False
                    ) -> Generator[Optional[tuple], object, List[Translation]]:
        """_translate_batch one decoder step per ``next`` (the batch engine; the sentence
        engine runs whole at the first). Run each step under ``inference()``; the translator
        must have a decoder of its own (``replica``) while another batch is between steps.
        ``shared``: the model's work is yielded as requests (search_steps). ``join`` (with
        ``shared``): where the search and model allow it, new sentences may join between steps:
        the search yields ("join",) and takes back None or a list of batches, each a list of
        sentences' tokens, numbered after the sentences it has (none empty)."""
        results = [Translation(offset + i, src_tokens[i], self.src_vocab.decode(
            self.src_vocab.encode(src_tokens[i]))) for i in indices]
        if self.empty_source(src_tokens[indices[0]]):  # the batch of empty lines: empty outputs
            for t, i in zip(results, indices):
                t.preds, t.scores, t.attns = [[]] * self.opt.n_best, [0.0] * self.opt.n_best, \
                    [torch.zeros(0, 0)] * self.opt.n_best
                if tgt_tokens is not None:
                    t.gold, t.gold_score = tgt_tokens[i], 0.0
            return self._detokenized(results)
        src, src_len, max_length = self._source([src_tokens[i] for i in indices])
        if tgt_tokens is not None and not self.opt.tgt_file_prefix:
            gold = self._gold_scores(src, src_len, [tgt_tokens[i] for i in indices])
            for t, i, score in zip(results, indices, gold):
                t.gold, t.gold_score = tgt_tokens[i], score
        if self.opt.beam_size == 1 or self.opt.beam_engine == "batch":
            prefixes, opt = None, self.opt
            if self.opt.tgt_file_prefix:
                prefixes = self._target_ids([tgt_tokens[i] for i in indices])[1]
                if self.preset.rule == "slots":
                    # OpenNMT-py 3.5.1, decode_strategy.py DecodeStrategy.initialize: the limits
                    # grow by the batch's prefix lengths, max_length by the longest and
                    # min_length by the shortest ("self.max_length += max(prefix_non_pad) - 1")
                    words = [len(tgt_tokens[i]) for i in indices]
                    max_length += max(words)
                    opt = dataclasses.replace(opt, min_length=opt.min_length + min(words))
            search = build_search(self.preset, opt, batch=src.size(0),
                                  vocab=self.tgt_vocab, max_length=max_length,
                                  exempt=self.exclusion, sampler=self.sampler,
                                  prefixes=prefixes)
            join = join and shared and self.joinable()
            steps = search_steps(self.model, src, src_len, search, beam_size=self.opt.beam_size,
                                 bos=self.tgt_vocab.bos, keep_attention=self.opt.keep_attention,
                                 shared=shared, join=join)
            hyps = yield from (self._translations_as_they_end(steps, results) if shared
                               else steps)
        else:
            hyps = self._beam_search(src, src_len, max_length)
        late = [t for t in results if not t.preds]  # not answered as they ended (shared)
        for t, nbest in zip(results, hyps):
            if not t.preds:
                self._fill(t, nbest)
        self._detokenized(late)
        return results

    def joinable(self) -> bool:
        """Whether sentences may join its searches between steps (``batch_steps``' ``join``):
        the search's rule and processors and the model allow it."""
        if self.opt.tgt_file_prefix or not (self.opt.beam_size == 1
                                            or self.opt.beam_engine == "batch"):
            return False
        search = build_search(self.preset, self.opt, batch=1, vocab=self.tgt_vocab,
                              max_length=self.opt.max_length, exempt=self.exclusion,
                              sampler=self.sampler)
        return search.joinable() and self.model.joinable()

    def _fill(self, t: Translation, nbest: List[Hypothesis]) -> None:
        t.preds = [self._target_tokens(hyp, t.src) for hyp in nbest]
        t.scores = [hyp.score for hyp in nbest]
        t.attns = [hyp.attn for hyp in nbest]

    def _source(self, lines: List[List[str]]):
        """Sentences' tokens -> src (B, S) ids, src_len (B,) and the batch's max_length."""
        ids = [self.src_vocab.encode(tokens) for tokens in lines]
        src_len = torch.tensor([len(x) for x in ids], device=self.device)
        src = torch.full((len(ids), int(src_len.max())), self.src_vocab.pad, dtype=torch.long)
        for row, x in enumerate(ids):
            src[row, :len(x)] = torch.tensor(x)
        return src.to(self.device), src_len, self._max_length(src.size(1))

    def _max_length(self, width: int) -> int:
        """The length limit of a batch whose longest source has ``width`` tokens."""
        if self.opt.max_length_ratio > 0:  # OpenNMT-py: from the batch's padded source length
            return int(min(self.opt.max_length, width * self.opt.max_length_ratio + 5))
        return self.opt.max_length

    def _translations_as_they_end(self, steps, results: List[Translation]):
        """A shared search's requests passed through; each sentence that ends yielded as
        ("ended", its place in the batch, its Translation); sentences that join (a list of
        batches of tokens) numbered on after the others."""
        value = None
        while True:
            try:
                event = steps.send(value)
            except StopIteration as end:
                return end.value
            if event[0] == "ended":
                t = results[event[1]]
                self._fill(t, event[2])
                value = yield "ended", event[1], self._detokenized([t])[0]
            elif event[0] == "join":  # the batches offered, as one: one encoder call
                batches, value = (yield event) or [], None
                if batches:
                    lines = [tokens for batch in batches for tokens in batch]
                    results += [Translation(len(results), tokens, self.src_vocab.decode(
                        self.src_vocab.encode(tokens))) for tokens in lines]
                    src, src_len, _ = self._source(lines)
                    value = src, src_len, [self._max_length(max(map(len, batch)))
                                           for batch in batches for _ in batch]
            else:
                value = yield event

    def _detokenized(self, results: List[Translation]) -> List[Translation]:
        if self.transform is not None:
            for t in results:
                t.texts = [self.transform.decode(pred) for pred in t.preds]
        return results

    def _beam_search(self, src, src_len, max_length: int) -> List[List[Hypothesis]]:
        """One Beam per sentence; finished sentences leave the decoder state."""
        k, dec = self.opt.beam_size, self.model.decoder
        # 1. Encode once, then repeat every state row beam_size times.
        memory, final = self.model.encode(src, src_len)
        dec.init_state(src_len, memory, final)
        dec.map_state(lambda state, dim: state.repeat_interleave(k, dim=dim))
        beams = [self._new_beam(max_length) for _ in range(src.size(0))]
        live = list(range(len(beams)))  # sentence of each block of k decoder rows
        for step in range(1, max_length + 1):
            # 2. One decoder step for the current tokens of all live beams.
            tokens = torch.cat([beams[b].get_current_state() for b in live]).to(self.device)
            out, attn = dec.step(tokens)
            log_probs = self.model.log_probs(out).cpu()
            if self.opt.banned_tokens:
                BannedTokens(self.opt.banned_tokens, renormalise=True)(log_probs, step, None)
            if self.opt.forced_eos and step == max_length:
                force_eos(log_probs, self.tgt_vocab.eos)
            attn = attn.float().cpu()
            # 3. Each beam advances with its own rows; attention without source padding.
            select, still = [], []
            for row, b in enumerate(live):
                rows = slice(row * k, (row + 1) * k)
                beams[b].advance(log_probs[rows], attn[rows, :int(src_len[b])])
                if not beams[b].done():
                    still.append(b)
                    select.append(beams[b].get_current_origin() + row * k)
            if not still:
                break
            # 4. Reorder (and shrink) the decoder state: each row follows its hypothesis.
            live = still
            select_indices = torch.cat(select).to(self.device)
            dec.map_state(lambda state, dim: state.index_select(dim, select_indices))
        results = []
        for beam in beams:
            scores, ks = beam.sort_finished(minimum=self.opt.n_best)
            nbest = []
            for score, (timestep, kk) in zip(scores[:self.opt.n_best], ks[:self.opt.n_best]):
                tokens, attn = beam.get_hyp(timestep, kk)
                nbest.append(Hypothesis(tokens, score, attn))
            results.append(nbest)
        return results

    def _new_beam(self, max_length: int) -> Beam:
        return self.beam_class(self.opt.beam_size, self.tgt_vocab.pad, self.tgt_vocab.bos,
                    self.tgt_vocab.eos, n_best=self.opt.n_best, global_scorer=self.scorer,
                    min_length=self.opt.min_length, stepwise_penalty=self.opt.stepwise_penalty,
                    block_ngram_repeat=self.opt.block_ngram_repeat,
                    exclusion_tokens=self.exclusion, max_length=max_length)

    def _gold_scores(self, src, src_len, refs: List[List[str]]) -> List[float]:
        """Log-probability of each reference, ``</s>`` included, no penalty."""
        tgt_in, tgt_out = self._target_ids(refs)
        log_probs, _ = self.model(src, src_len, tgt_in)
        gathered = log_probs.gather(2, tgt_out.unsqueeze(2)).squeeze(2)
        gathered = gathered.masked_fill(tgt_out.eq(self.tgt_vocab.pad), 0.0)
        return gathered.sum(1).tolist()

    def _target_ids(self, refs: List[List[str]]):
        """Target token lines -> decoder inputs (<s> w1 .. wn) and outputs (w1 .. wn </s>),
        (B, longest + 1) each, padded."""
        ids = [self.tgt_vocab.encode(r) for r in refs]
        length = max(len(x) for x in ids) + 1
        tgt_in = torch.full((len(ids), length), self.tgt_vocab.pad, dtype=torch.long)
        tgt_out = tgt_in.clone()
        for row, x in enumerate(ids):
            tgt_in[row, :len(x) + 1] = torch.tensor([self.tgt_vocab.bos] + x)
            tgt_out[row, :len(x) + 1] = torch.tensor(x + [self.tgt_vocab.eos])
        return tgt_in.to(self.device), tgt_out.to(self.device)

    def _target_tokens(self, hyp: Hypothesis, src: List[str]) -> List[str]:
        ids = hyp.tokens[:-1] if hyp.tokens and hyp.tokens[-1] == self.tgt_vocab.eos \
            else hyp.tokens
        tokens = self.tgt_vocab.decode(ids)
        if self.opt.replace_unk:
            for i, token_id in enumerate(ids):
                if token_id == self.tgt_vocab.unk and hyp.attn.size(1) > 0:
                    tokens[i] = self._phrase(src[int(hyp.attn[i].argmax())])
        return tokens

    def _phrase(self, word: str) -> str:
        """``word``'s translation in -phrase_table, else ``word``. As OpenNMT-py reads the
        table: the last line that starts with ``word`` (a prefix match) gives it."""
        phrase = word
        for line in self.phrase_table:
            if line.startswith(word):
                phrase = line.split("|||")[1].strip()
        return phrase


def read_phrase_table(path: str) -> List[str]:
    """The lines of a -phrase_table file ("source|||target" each); refuses others by line."""
    if not path:
        return []
    lines = list(lines_of(path))
    for line_number, line in enumerate(lines, 1):
        if "|||" not in line:
            raise InputError(f"{path}: line {line_number}: expected 'source|||target', got "
                             f"{line[:40]!r}")
    return lines


def _line_count(src) -> Optional[int]:
    """The progress bar's total: the lines of a regular file (read once, fast) or of a list; None
    for standard input, a pipe or a device, which counting would use up."""
    if not isinstance(src, str):
        return len(src) if hasattr(src, "__len__") else None
    if src == "-" or not os.path.isfile(src):
        return None
    with open(src, "rb") as f:
        data = f.read(1 << 20)
        count, last = 0, b"\n"
        while data:
            count += data.count(b"\n")
            last = data[-1:]
            data = f.read(1 << 20)
    return count + (last != b"\n")


def _shards(src, tgt, shard_size: int):
    """Yields (offset, source lines, target lines or None) of up to ``shard_size`` lines."""
    src_iter = lines_of(src)
    tgt_iter = lines_of(tgt) if tgt is not None else None
    offset = 0
    while True:
        src_lines = list(itertools.islice(src_iter, shard_size or None))
        tgt_lines = None
        if tgt_iter is not None:
            tgt_lines = list(itertools.islice(tgt_iter, len(src_lines)))
            short = len(tgt_lines) < len(src_lines)
            src_ended = not shard_size or len(src_lines) < shard_size
            long = src_ended and not short and next(tgt_iter, None) is not None
            if short or long:
                n_src = offset + len(src_lines) + sum(1 for _ in src_iter)
                n_tgt = offset + len(tgt_lines) + long + sum(1 for _ in tgt_iter)
                name = tgt if isinstance(tgt, str) else "-tgt"
                raise InputError(f"{name}: has {n_tgt} lines but the source has {n_src}")
        if not src_lines:
            return
        yield offset, src_lines, tgt_lines
        offset += len(src_lines)


def _get(opt, name, default=None):
    return opt.get(name, default) if isinstance(opt, dict) else getattr(opt, name, default)


def _device(gpu: Optional[int]) -> str:
    """"cpu" for gpu -1 (or None), else "cuda:N" (under torchrun N is the local rank); refuses
    a GPU this machine does not have."""
    if gpu is None or gpu < 0:
        return "cpu"
    if world()[1] > 1:  # torchrun: each worker on its local rank's GPU
        gpu = local_rank()
    if not torch.cuda.is_available():
        why = ("this torch build has no CUDA support" if torch.version.cuda is None
               else "no CUDA device is visible")
        raise ValueError(f"-gpu {gpu}: {why} (-gpu -1 translates on the CPU)")
    count = torch.cuda.device_count()
    if gpu >= count:
        raise ValueError(f"-gpu {gpu}: this machine has {count} GPU(s), ids 0 to {count - 1}")
    return f"cuda:{gpu}"


def build_translator(opt) -> Translator:
    """Loads ``opt.model`` (native or OpenNMT-py 3.x checkpoint, or Marian directory) and
    returns a Translator.

    ``opt`` is a dict or a namespace with ``model``, ``gpu``, ``int8``, ``precision``,
    ``inter_threads`` and any DecodingOptions field. A model's generation defaults (Marian)
    apply to the options the user did not give: a dict's keys, or a namespace's
    ``given_options``.
    """
    paths = _get(opt, "model")
    paths = [paths] if isinstance(paths, str) else list(paths)
    fields = DecodingOptions.__dataclass_fields__
    values = {name: _get(opt, name) for name in fields if _get(opt, name) is not None}
    _check_options(opt, values, len(paths))
    device = _device(_get(opt, "gpu", -1))
    threads = torch.get_num_threads()
    # loading on one torch thread: its few parallel operations (weight initialisation before
    # the checkpoint's weights replace it, conversions) gain little from more, and an OpenMP
    # team on a busy CPU waits for its descheduled threads (18% of a one-line run's time)
    torch.set_num_threads(1)
    try:
        models, src_vocab, tgt_vocab, values, transform = _load(opt, paths, values, device)
    finally:
        torch.set_num_threads(threads)
    max_src = None  # the shortest position table of the models, if any has one
    for m in models:
        limit = getattr(getattr(m.encoder, "embeddings", None), "max_len", None)
        if limit is not None:  # a Transformer: the decoder's first input takes position 0
            max_src = min(max_src or limit, limit)
            values["max_length"] = min(values.get("max_length", DecodingOptions.max_length),
                                       m.decoder.embeddings.max_len - 1)
    model = models[0] if len(models) == 1 else EnsembleModel(
        models, bool(_get(opt, "avg_raw_probs", False)))
    options = DecodingOptions(**values)
    inter_threads = _get(opt, "inter_threads")
    workers = _get(opt, "workers") or 1
    translator = Translator(model, src_vocab, tgt_vocab, options, device, max_src,
                            1 if inter_threads is None else inter_threads, transform, workers)
    if _get(opt, "compile"):
        _compile_or_not(translator, models, device)
    return translator


def _compile_or_not(translator: Translator, models: list, device: str) -> None:
    """-compile: builds (or loads) the model's programs at load (warm_up), on one thread: no
    OpenMP team is started before a fork (compiled_step.py). Where torch cannot export or
    compile them, one line says why and the model runs uncompiled."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        translator.warm_up()
    except Exception as err:  # noqa: BLE001 - any failure of export or compiler: run uncompiled
        why = next((line for line in str(err).splitlines() if line.strip()), "")
        logger.warning("-compile: torch could not compile the model's programs on %s (%s: "
                       "%s): they run uncompiled", device, type(err).__name__, why.strip()[:200])
        for model in models:
            model.decoder.compiled_step = model.compiled_output = model.compiled_encoder = None
    finally:
        torch.set_num_threads(threads)


def _load(opt, paths: List[str], values: dict, device: str):
    """The models of ``paths`` ready for inference, their vocabularies, the decoding values
    with the model's generation defaults, and the transform."""
    path = paths[0]
    model, ckpt = load_model(path, device)
    src_vocab, tgt_vocab = ckpt.src_vocab, ckpt.tgt_vocab
    given = _get(opt, "given_options")
    given = set(opt) if given is None and isinstance(opt, dict) else set(given or ())
    preset = PRESETS.get(values.get("search", "onmt"))  # an unknown one: refused by validate
    for name, value in preset.defaults if preset else ():
        if name not in given:  # the toolkit's own default, not onmt_lite's
            values[name] = value
    if ckpt.tokenizer.get("kind") == "marian":
        if _get(opt, "transforms"):
            raise TransformOptionError("-transforms: a Marian model brings its own tokenizer "
                                       "(source.spm, target.spm, vocab.json)")
        transform = marian.build_tokenizer(ckpt.tokenizer, path)
        _check_pieces_fit(transform, src_vocab, tgt_vocab)
        values.update(_generation_defaults(ckpt, given, values, path))
    else:
        transform = build_transform(lambda name: _get(opt, name), ckpt.opt, path,
                                    ckpt.subword_models)
        _check_pieces_fit(transform, src_vocab, tgt_vocab)
    del ckpt  # its weights are in the model now: free them before quantising, not after
    models = [model] + [_ensemble_member(other, device, src_vocab, tgt_vocab, path)
                        for other in paths[1:]]
    models = [for_inference(m, device, bool(_get(opt, "int8", False)),
                            _get(opt, "precision", "auto") or "auto", bool(_get(opt, "fast")),
                            bool(_get(opt, "compile")), _get(opt, "compile_cache", "") or "",
                            _get(opt, "int8_engine", "auto") or "auto")
              for m in models]
    return models, src_vocab, tgt_vocab, values, transform


def _check_options(opt, values: dict, models: int) -> None:
    """Refuses, before any model loads, the numbers out of range among the options given and
    the combinations build_translator cannot serve (OptionError)."""
    check_numbers({**values, **{name: _get(opt, name) for name in ("gpu", "threads",
                                                                    "inter_threads", "workers")
                                if _get(opt, name) is not None}})
    if models > 1 and values.get("search", "onmt") != "onmt":
        raise OptionError("-model: an ensemble decodes with -search onmt only")
    if (_get(opt, "workers") or 1) > 1 and (_get(opt, "threads") or 1) != 1:
        raise OptionError("-workers runs one torch thread per process: give -threads 1 (or 0)")


def _ensemble_member(path: str, device: str, src_vocab, tgt_vocab, first: str):
    """Another model of an ensemble: it must read and write the first one's vocabularies."""
    model, ckpt = load_model(path, device)
    if ckpt.tokenizer.get("kind") == "marian":
        raise CheckpointError(f"{path}: a Marian model cannot join an ensemble")
    if ckpt.src_vocab.itos != src_vocab.itos or ckpt.tgt_vocab.itos != tgt_vocab.itos:
        raise CheckpointError(f"{path}: its vocabularies differ from those of {first}: the "
                              "models of an ensemble share one vocabulary")
    return model


FITTING_SHARE = 0.5  # of a subword model's pieces that the model's vocabulary must hold


def _check_pieces_fit(transform, src_vocab, tgt_vocab) -> None:
    """Refuses a subword model made for another model: most of its pieces would be unknown."""
    if not hasattr(transform, "pieces"):
        return
    for side, vocab in (("src", src_vocab), ("tgt", tgt_vocab)):
        path, pieces = transform.pieces(side)
        known = sum(piece in vocab.stoi for piece in pieces)
        if pieces and known < FITTING_SHARE * len(pieces):
            hint = "" if isinstance(transform, marian.MarianTokenizer) else \
                f" (wrong -{side}_subword_model?)"
            raise TransformError(f"{path}: does not fit the model's vocabulary: {known} of "
                                 f"its {len(pieces)} pieces are in it{hint}")


def _generation_defaults(ckpt, given: set, values: dict, path: str) -> dict:
    """The DecodingOptions values a Marian model's generation settings give where the user
    gave none, as ``generate()`` applies them."""
    search = values.get("search", DecodingOptions.search)
    if search == "ctranslate2":  # as CTranslate2 runs the model its converter makes of it:
        # no generation settings, and <pad> left out of the vocabulary
        return {"forced_eos": False, "banned_tokens": [ckpt.tgt_vocab.pad]}
    try:
        settings, banned, forced = marian.decoding_settings(
            ckpt.generation, ckpt.tgt_vocab, search)
    except marian.MarianError as err:
        raise CheckpointError(f"{path}: {err}") from None
    settings = {k: v for k, v in settings.items() if k not in given}
    if "max_length_ratio" not in given:  # generate() has no limit from the source length
        settings["max_length_ratio"] = 0.0
    beam_size = settings.get("beam_size", values.get("beam_size", DecodingOptions.beam_size))
    onmt = values.get("search", DecodingOptions.search) == "onmt"
    if onmt and "length_penalty" not in given and beam_size == 1:  # sums, as generate()
        settings["length_penalty"] = "none"
    settings["forced_eos"] = forced
    settings["banned_tokens"] = banned
    applied = marian.describe({k: v for k, v in settings.items()
                               if k not in ("max_length_ratio", "forced_eos", "banned_tokens")},
                              banned, forced, ckpt.tgt_vocab)
    if applied:
        logger.info("the model's generation defaults apply: %s", applied)
    return settings
