"""The search loop: every sentence of a batch advances with a few tensor operations a step.

One loop serves every search: a ``Search`` names its processors, its candidate selection and
its finishing rule (see presets.py). With the OpenNMT rule it has the semantics, scores and
results of one Beam per sentence (beam.py). Greedy search and sampling are this loop with one
hypothesis per sentence. Only bookkeeping of finished hypotheses touches Python lists, and only
at steps where some hypothesis ends.
"""
import itertools
from dataclasses import dataclass, field
from typing import Generator, Iterator, List, Optional, Sequence, Union

import torch
from torch.nn import functional as F

from onmt_lite.search.candidates import Sampler, TopK
from onmt_lite.search.finishing import Hypothesis
from onmt_lite.search.processors import Processor


@dataclass
class Search:
    """One search, as the loop runs it.

    Args:
        rule: the finishing rule (search/finishing/), made for this batch.
        processors: edit the step's log-probabilities (min length, bans, penalties).
        candidate_processors: edit the ranked candidate scores (OpenNMT-py's n-gram block).
        selection: TopK, or a Sampler (one hypothesis per sentence).
        on_logits: processors edit logits, normalised after them (Hugging Face's greedy).
    """
    rule: object
    processors: Sequence[Processor] = ()
    candidate_processors: Sequence[Processor] = ()
    selection: object = field(default_factory=TopK)
    on_logits: bool = False

    def joinable(self) -> bool:
        """Whether sentences may join this search between its steps (search_steps' ``join``):
        its rule and processors take sentences at steps of their own."""
        return bool(getattr(self.rule, "joinable", False)) and isinstance(
            self.selection, TopK) and all(
            p.step_free for p in (*self.processors, *self.candidate_processors))


def beam_search(model, src: torch.Tensor, src_len: torch.Tensor, search: Search, *,
                beam_size: int, bos: int, keep_attention: bool = True) -> List[List[Hypothesis]]:
    """Searches a batch to its end (see search_steps)."""
    return run_to_end(search_steps(model, src, src_len, search, beam_size=beam_size, bos=bos,
                                   keep_attention=keep_attention))


def run_to_end(steps: Iterator):
    """The value a step generator returns, once every step has run."""
    while True:
        try:
            next(steps)
        except StopIteration as end:
            return end.value


def search_steps(model, src: torch.Tensor, src_len: torch.Tensor, search: Search, *,
                 beam_size: int, bos: int, keep_attention: bool = True, shared: bool = False,
                 join: bool = False) -> Generator[Optional[tuple], object, List[List[Hypothesis]]]:
    """Searches a batch one decoder step per ``next``; finished sentences leave the decoder
    state. Between steps the caller may run other searches, each with its own decoder state.

    With ``shared``, the search does not run its model itself: it yields each request
    (``("step", decoder, tokens)``, then ``("log_probs", model, out)``) and the caller sends
    back the result, having run it with other searches' requests (models/shared_step.py: the
    server's lanes decode their batches' steps together). It also yields ``("ended", sentence,
    n-best)`` as each sentence ends (the caller sends back None).

    With ``join`` (and ``shared``; the search must be ``joinable``), the search yields
    ``("join",)`` before each step, and the caller sends back None or new
    sentences to decode beside the others: (src, src_len, each one's max_length), numbered
    after the sentences already in the search. Each row then decodes at a position of
    its own (the decoder's ``join``), each sentence has its own step count and limit (the
    rule's ``join``), and a sentence's history starts at the step it joined.

    Args:
        src: (B, S) source ids; src_len: (B,) lengths.
        keep_attention: each hypothesis keeps its attention; without it, its attention has
            width 0, and a step does not copy the attention history of every row (a cost that
            grows with the output's length).
    Returns:
        for each sentence, its n-best hypotheses, best first.
    """
    k, batch, dec, device = beam_size, src.size(0), model.decoder, src.device
    rule, selection = search.rule, search.selection
    sampling = isinstance(selection, Sampler)  # one token drawn per hypothesis
    processors = list(search.processors) + list(search.candidate_processors)
    stateful = any(p.stateful for p in processors)
    # a. Encode once (the first step, where every hypothesis is hypothesis 0: _decoder_step).
    memory, final = model.encode(src, src_len)
    dec.init_state(src_len, memory, final)
    paths = Paths(batch, k, bos, src.size(1) if keep_attention else 0, src_len.tolist(), device)
    rule.start(batch, k, _padding(src, src_len, k))

    for step in itertools.count(1):  # step = prefix length, <s> included (the first sentences')
        if not join and step > rule.max_length:
            break
        if join:
            joining = yield "join",
            if joining is not None:
                _join(model, rule, paths, joining, step, keep_attention)
            paths.trim()
        n, live = len(paths.live), paths.live
        # b. One decoder step for all live hypotheses.
        out, attn = yield from _decoder_step(shared, dec, paths.seqs, k, step == 1 and k > 1)
        attn = attn.float()
        # c. Processors edit the step's log-probs; the rule ranks the candidates.
        if search.on_logits and any(p.acts(step) for p in search.processors):
            # at other steps log_softmax(logits) is log_probs (a compiled program's, if any)
            logits = model.generator(out).float()  # (n * k, V)
            for processor in search.processors:
                processor(logits, step, paths.seqs)
            log_probs = torch.log_softmax(logits, dim=-1)
        else:
            log_probs = yield from _ask(shared, "log_probs", model, out)  # (n * k, V)
            for processor in search.processors:
                processor(log_probs, step, paths.seqs)
        vocab = log_probs.size(1)
        allowed = log_probs.clone() if sampling else None  # what a sample draws from
        ranked = rule.rank(log_probs, step, attn)
        for processor in search.candidate_processors:
            processor(ranked, step, paths.seqs)
            if allowed is not None:
                processor(allowed, step, paths.seqs)
        # d. The chosen candidates of each sentence: their origin rows and tokens.
        if sampling:
            ids = selection.draw(allowed).view(n, 1)
            values = ranked.gather(1, ids)
        else:
            values, ids = selection.pick(ranked.view(n, k, vocab), k)  # (n, width)
        origin, tokens = torch.div(ids, vocab, rounding_mode="floor"), ids.remainder(vocab)
        if hasattr(rule, "revise"):  # a rule that edits the chosen candidates
            values, origin, tokens = rule.revise(values, origin, tokens, step)
        rows = origin if n == 1 else origin + torch.arange(  # (n, width)
            0, n * k, k, device=device).unsqueeze(1)
        flat = rows.view(-1)
        cand_attn = attn.index_select(0, flat)
        paths.extend(flat, tokens.view(-1, 1), cand_attn)
        # e. The rule records what ended and says what runs on and which sentences are done.
        going_on, done = rule.advance(values, rows, tokens, step, cand_attn,
                                      paths.path_of(ids.size(1)))
        select, tokens = paths.choose(going_on, flat, tokens)
        if stateful:
            select_list, token_list = select.tolist(), tokens.view(-1).tolist()
            for processor in processors:
                processor.advance(select_list, token_list)
        keep = list(range(n))
        if done:
            for i, nbest in done.items():
                paths.results[live[i]] = nbest
                if shared:  # the caller may answer it before the batch ends
                    yield "ended", live[i], nbest
            keep = [i for i in range(n) if i not in done]
            if not keep:
                break
        # f. Reorder the decoder state by the chosen origins, dropping finished sentences.
        if len(keep) < n:
            keep = fill_gaps(keep)
            kept_rows = paths.keep(keep)
            rule.keep(torch.tensor(keep, device=device), kept_rows)
            select = select.index_select(0, kept_rows)
            if stateful:
                rows_list = kept_rows.tolist()
                for processor in processors:
                    processor.keep(rows_list)
        if k > 1 or len(keep) < n:  # one hypothesis per sentence stays where it is
            dec.map_state(lambda state, dim: state.index_select(dim, select))
        if not shared:
            yield
    return paths.results


class Paths:
    """The hypotheses' histories and their sentences: tokens (rows, t) and attention
    (rows, t, width), the original sentence of each block of k rows (``live``), each sentence's
    first column (joined sentences start later: left padding), its source length, its n-best.

    ``extend`` makes the step's candidates' histories, ``choose`` keeps those that go on, and
    ``keep`` the rows of the sentences that go on.
    """

    def __init__(self, batch: int, k: int, bos: int, attn_width: int, lengths: List[int],
                 device):
        self.k, self.bos, self.device = k, bos, device
        self.seqs = torch.full((batch * k, 1), bos, dtype=torch.long, device=device)
        self.attn_hist = torch.zeros(batch * k, 0, attn_width, device=device)
        self.attn_width = attn_width  # 0: no attention kept (see search_steps)
        self.live = list(range(batch))
        self.start = [0] * batch  # each sentence's column of <s> in seqs
        self.lengths = lengths
        self.results: List[Optional[List[Hypothesis]]] = [None] * batch

    def join(self, lengths: List[int], src_width: int, keep_attention: bool) -> None:
        """Sentences that join: numbered after those already here, <s> in the last column."""
        count, k = len(lengths), self.k
        if keep_attention and src_width > self.attn_hist.size(2):
            self.attn_hist = F.pad(self.attn_hist, (0, src_width - self.attn_hist.size(2)))
        self.live += range(len(self.results), len(self.results) + count)
        self.results += [None] * count
        self.lengths += lengths
        columns = self.seqs.size(1)
        self.start += [columns - 1] * count
        self.seqs = torch.cat([self.seqs, self.seqs.new_full((count * k, columns), self.bos)])
        self.attn_hist = torch.cat([self.attn_hist, self.attn_hist.new_zeros(
            count * k, columns - 1, self.attn_hist.size(2))])

    def trim(self) -> None:
        """Drops the columns no live sentence reads (joins)."""
        first = min(self.start[i] for i in self.live)
        if first > 0:
            self.seqs, self.attn_hist = self.seqs[:, first:], self.attn_hist[:, first:]
            for i in self.live:
                self.start[i] -= first
        self.attn_width = self.attn_hist.size(2)

    def extend(self, flat: torch.Tensor, tokens: torch.Tensor, cand_attn: torch.Tensor) -> None:
        """The candidates' histories: their origin rows' (``flat``), one token and attention
        row more (none kept: an empty history of their rows, nothing to copy)."""
        self.cand_seqs = torch.cat([self.seqs.index_select(0, flat), tokens], dim=1)
        if self.attn_width:
            self.cand_hist = torch.cat([self.attn_hist.index_select(0, flat),
                                        cand_attn[:, None, :self.attn_width]], dim=1)
        else:
            self.cand_hist = self.attn_hist.new_empty(flat.numel(), self.attn_hist.size(1) + 1, 0)

    def path_of(self, width: int):
        """A function of candidate c: its tokens and attention, without source padding."""
        live, start, lengths = self.live, self.start, self.lengths
        cand_seqs, cand_hist = self.cand_seqs, self.cand_hist

        def path(c: int):
            sentence = live[c // width]
            return (cand_seqs[c, start[sentence] + 1:],
                    cand_hist[c, start[sentence]:, :lengths[sentence]])
        return path

    def choose(self, going_on: Union[torch.Tensor, int, None], flat: torch.Tensor,
               tokens: torch.Tensor):
        """Keeps the candidates that go on: (n, k) places in each sentence's ``width``, an int
        j for the first j of each (a slice: nothing to gather), or None for all; returns their
        origin rows and tokens."""
        if going_on is None:
            self.seqs, self.attn_hist = self.cand_seqs, self.cand_hist
            return flat, tokens
        if isinstance(going_on, int):
            n, width = tokens.shape

            def first(rows: torch.Tensor) -> torch.Tensor:
                shape = rows.shape[1:]
                return rows.view(n, width, *shape)[:, :going_on].reshape(n * going_on, *shape)
            self.seqs, self.attn_hist = first(self.cand_seqs), first(self.cand_hist)
            return first(flat), first(tokens.reshape(-1))
        n, width = going_on.size(0), tokens.size(1)
        chosen = (going_on + torch.arange(n, device=self.device).unsqueeze(1) * width).view(-1)
        self.seqs = self.cand_seqs.index_select(0, chosen)
        self.attn_hist = self.cand_hist.index_select(0, chosen)
        return flat.index_select(0, chosen), tokens.view(-1).index_select(0, chosen)

    def keep(self, keep: List[int]) -> torch.Tensor:
        """Keeps the sentences ``keep`` (places in ``live``); returns their rows."""
        k = self.k
        rows = torch.tensor([i * k + j for i in keep for j in range(k)], device=self.device)
        self.live = [self.live[i] for i in keep]
        self.seqs, self.attn_hist = self.seqs.index_select(0, rows), \
            self.attn_hist.index_select(0, rows)
        return rows


def _padding(src: torch.Tensor, src_len: torch.Tensor, k: int) -> torch.Tensor:
    """(rows, S): True at each row's source padding."""
    return (torch.arange(src.size(1), device=src.device) >= src_len.unsqueeze(1)
            ).repeat_interleave(k, dim=0)


def _join(model, rule, paths: Paths, joining, step: int, keep_attention: bool) -> None:
    """Sentences joining a search between steps: (src, src_len, each one's max_length)."""
    src, src_len, max_lengths = joining
    memory, _ = model.encode(src, src_len)
    model.decoder.join(src_len, memory, 1 if step == 1 else paths.k)  # step 1: one row each
    rule.join(_padding(src, src_len, paths.k), max_lengths, step)
    paths.join(src_len.tolist(), src.size(1), keep_attention)


def _ask(shared: bool, kind: str, owner, x: torch.Tensor):
    """``owner.step(x)`` or ``owner.log_probs(x)``; with ``shared``, asked of the caller."""
    if shared:
        return (yield kind, owner, x)
    return owner.step(x) if kind == "step" else owner.log_probs(x)


def _decoder_step(shared: bool, dec, seqs: torch.Tensor, k: int, first: bool):
    """The decoder's step for every live hypothesis (rows are sentence-major: b * k + j). At a
    beam's ``first`` step they all extend hypothesis 0, so one row a sentence steps, then every
    state row is repeated k times; where the decoder ``tiles_first_step``, before it (a
    compiled step: the program of k rows a sentence serves it)."""
    tile = lambda state, dim: state.repeat_interleave(k, dim=dim)  # noqa: E731
    tiled = first and getattr(dec, "tiles_first_step", lambda _: False)(seqs.size(0) // k)
    if first and not tiled:
        out, attn = yield from _ask(shared, "step", dec, seqs[::k, -1])
        dec.map_state(tile)
        return _repeat(out, k), attn.repeat_interleave(k, dim=0)
    if tiled:
        dec.map_state(tile)
    return (yield from _ask(shared, "step", dec, seqs[:, -1]))


def _repeat(out, k: int):
    """Decoder output (an ensemble's: one per model) with each row repeated k times."""
    if isinstance(out, list):
        return [o.repeat_interleave(k, dim=0) for o in out]
    return out.repeat_interleave(k, dim=0)


def fill_gaps(keep: List[int]) -> List[int]:
    """The sentences ``keep`` in a new order: those below ``len(keep)`` keep their place, the
    others fill the places of sentences that left, so the decoder's cache moves only those."""
    kept, movers = set(keep), iter(i for i in keep if i >= len(keep))
    return [i if i in kept else next(movers) for i in range(len(keep))]
