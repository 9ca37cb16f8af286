"""Translator: files and lines in, translations out; encode once, tile by beam_size, step,
map_state; batches side by side on threads or forked processes."""
import contextlib
import copy
import dataclasses
import logging
import multiprocessing
import queue
from concurrent.futures import ThreadPoolExecutor
from typing import Generator, Iterator, List, Optional, Tuple, Union

import torch
from tqdm import tqdm

from onmt_lite.errors import OptionError
from onmt_lite.models.compiled_step import SMALL_ROWS
from onmt_lite.models.ensemble import EnsembleModel
from onmt_lite.models.model import inference, replica
from onmt_lite.search.beam import Beam
from onmt_lite.search.candidates import Sampler
from onmt_lite.search.finishing import Hypothesis
from onmt_lite.search.global_scorer import GNMTGlobalScorer
from onmt_lite.search.loop import run_to_end, search_steps
from onmt_lite.search.presets import PRESETS, build_search
from onmt_lite.search.processors import BannedTokens, force_eos
from onmt_lite.transforms import SubwordTransform
from onmt_lite.translate import batching, paragraphs
from onmt_lite.translate.distributed import block, gather, join, world
from onmt_lite.translate.options import DecodingOptions, check_numbers
from onmt_lite.translate.phrase_table import phrase, read_phrase_table
from onmt_lite.translate.sources import SourceReader
from onmt_lite.translate.translation import Translation
from onmt_lite.translate.workers import WorkerPool
from onmt_lite.vocab import unknown_tokens_warning

logger = logging.getLogger("onmt_lite")


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
    compiles = False  # built to decode through compiled programs (build_translator)

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
        """Like translate, yielding each Translation in input order as soon as it is ready;
        with -split_sentences, each line's sentences translated as one (paragraphs.py)."""
        if self.opt.split_sentences:
            return paragraphs.translate_paragraphs(self, src, tgt, batch_size, progress,
                                                   batch_type, shard_size)
        return self._in_order(self.translate_batches(src, tgt, batch_size, progress=progress,
                                                     batch_type=batch_type,
                                                     shard_size=shard_size))

    @staticmethod
    def _in_order(batches) -> Iterator[Translation]:
        results, next_out = {}, 0
        for batch in batches:
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

    def numbered_batches(self, *args, **kwargs) -> Iterator[Tuple[int, List[Translation]]]:
        """sentence_batches, where each line is one sentence (not with -split_sentences)."""
        if self.opt.split_sentences:
            raise OptionError("-split_sentences translates a file's lines in order: not with "
                              "-resume or batch by batch")
        return self.sentence_batches(*args, **kwargs)

    def sentence_batches(self, src, tgt=None, batch_size: int = 30, progress: bool = False,
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
        with tqdm(disable=not show, total=batching.line_count(src) if show else None,
                  desc="translate", unit="sent", leave=False) as bar, \
                contextlib.ExitStack() as stack:
            processes = stack.enter_context(WorkerPool(self, self.workers)) \
                if self.workers > 1 else None
            for offset, src_lines, tgt_lines in batching.shards(src, tgt, shard_size):
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
        """Decodes a batch of one sentence and one of more than SMALL_ROWS (source lengths 1
        to 3): -compile compiles its step programs here, at load (those for a few rows and
        those for more), rather than in the first batches."""
        word = self.src_vocab.itos[-1]
        lines = [[word] * (1 + i % 3) for i in range(SMALL_ROWS + 2)]
        targets = lines if self.opt.tgt_file_prefix else None  # forced as prefixes
        generator = getattr(self.sampler, "generator", None)
        state = None if generator is None else generator.get_state()
        self._translate_batch([0], lines, targets)
        self._translate_batch(list(range(1, len(lines))), lines, targets)
        if state is not None:  # a seeded run draws as it would without the warm-up
            generator.set_state(state)

    # -- batching -------------------------------------------------------------------------
    @property
    def source_reader(self) -> SourceReader:
        """How it reads a raw source line: through the transform (or split at whitespace), cut
        to -src_seq_length_trunc or the model's position table; under -search ctranslate2 a
        lone ``</s>`` has nothing to translate."""
        return SourceReader(self.transform, self.opt.src_seq_length_trunc or
                            self.model_max_src_len or 0, self.opt.search == "ctranslate2")

    def source_tokens(self, line: str, number: int) -> List[str]:
        """Line ``number``'s tokens as the model reads them (source_reader)."""
        return self.source_reader.tokens(line, number)

    def empty_source(self, tokens: List[str]) -> bool:
        """A source with nothing to translate (source_reader)."""
        return self.source_reader.empty(tokens)

    def _batches(self, src_tokens, tgt_tokens, batch_size: int, batch_type: str):
        """The shard's batches (batching.batches), the empty sources last."""
        return batching.batches(src_tokens, tgt_tokens, batch_size, batch_type,
                                self.empty_source)

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
                    tokens[i] = phrase(self.phrase_table, src[int(hyp.attn[i].argmax())])
        return tokens
