"""The search loop: every sentence of a batch advances with a few tensor operations a step.

One loop serves every search: a ``Search`` names its processors, its candidate selection and
its finishing rule (see presets.py). With the OpenNMT rule it has the semantics, scores and
results of one Beam per sentence (beam.py). Greedy search and sampling are this loop with one
hypothesis per sentence. Only bookkeeping of finished hypotheses touches Python lists, and only
at steps where some hypothesis ends.
"""
import itertools
from dataclasses import dataclass, field
from typing import Generator, Iterator, List, Optional, Sequence

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
    # a. Encode once. The first step extends hypothesis 0 only, so it runs on one row per
    # sentence; then every state row is repeated k times (rows are sentence-major: b * k + j).
    memory, final = model.encode(src, src_len)
    dec.init_state(src_len, memory, final)
    live = list(range(batch))  # original sentence of each block of k rows
    seqs = torch.full((batch * k, 1), bos, dtype=torch.long, device=device)  # (rows, t)
    attn_width = src.size(1) if keep_attention else 0
    attn_hist = torch.zeros(batch * k, 0, attn_width, device=device)  # (rows, t, width)
    padding = (torch.arange(src.size(1), device=device) >= src_len.unsqueeze(1)
               ).repeat_interleave(k, dim=0)  # (rows, S)
    rule.start(batch, k, padding)
    lengths = src_len.tolist()
    results: List[Optional[List[Hypothesis]]] = [None] * batch
    start = [0] * batch  # each sentence's column of <s> in seqs (joins: left padding)

    for step in itertools.count(1):  # step = prefix length, <s> included (the first sentences')
        if not join and step > rule.max_length:
            break
        if join:
            joining = yield "join",
            if joining is not None:
                src_new, len_new, max_lengths = joining
                memory, _ = model.encode(src_new, len_new)
                dec.join(len_new, memory, 1 if step == 1 else k)  # step 1: one row a sentence
                count = src_new.size(0)
                if keep_attention and src_new.size(1) > attn_hist.size(2):
                    attn_hist = F.pad(attn_hist, (0, src_new.size(1) - attn_hist.size(2)))
                rule.join((torch.arange(src_new.size(1), device=device) >= len_new.unsqueeze(1)
                           ).repeat_interleave(k, dim=0), max_lengths, step)
                live += range(len(results), len(results) + count)
                results += [None] * count
                lengths += len_new.tolist()
                columns = seqs.size(1)  # <s> goes in the last: the sentences start here
                start += [columns - 1] * count
                seqs = torch.cat([seqs, seqs.new_full((count * k, columns), bos)])
                attn_hist = torch.cat([attn_hist, attn_hist.new_zeros(
                    count * k, columns - 1, attn_hist.size(2))])
            first = min(start[i] for i in live)  # columns no live sentence reads
            if first > 0:
                seqs, attn_hist = seqs[:, first:], attn_hist[:, first:]
                for i in live:
                    start[i] -= first
            attn_width = attn_hist.size(2)
        n = len(live)
        # b. One decoder step for all live hypotheses.
        if step == 1 and k > 1:
            out, attn = yield from _ask(shared, "step", dec, seqs[::k, -1])
            dec.map_state(lambda state, dim: state.repeat_interleave(k, dim=dim))
            out, attn = _repeat(out, k), attn.repeat_interleave(k, dim=0)
        else:
            out, attn = yield from _ask(shared, "step", dec, seqs[:, -1])
        attn = attn.float()
        # c. Processors edit the step's log-probs; the rule ranks the candidates.
        if search.on_logits:
            logits = model.generator(out).float()  # (n * k, V)
            for processor in search.processors:
                processor(logits, step, seqs)
            log_probs = torch.log_softmax(logits, dim=-1)
        else:
            log_probs = yield from _ask(shared, "log_probs", model, out)  # (n * k, V)
            for processor in search.processors:
                processor(log_probs, step, seqs)
        vocab = log_probs.size(1)
        allowed = log_probs.clone() if sampling else None  # what a sample draws from
        ranked = rule.rank(log_probs, step, attn)
        for processor in search.candidate_processors:
            processor(ranked, step, seqs)
            if allowed is not None:
                processor(allowed, step, seqs)
        # d. The chosen candidates of each sentence: their origin rows and tokens.
        if sampling:
            ids = selection.draw(allowed).view(n, 1)
            values = ranked.gather(1, ids)
        else:
            values, ids = selection.pick(ranked.view(n, k, vocab), k)  # (n, width)
        width = ids.size(1)
        origin = torch.div(ids, vocab, rounding_mode="floor")
        tokens = ids - origin * vocab
        if hasattr(rule, "revise"):  # a rule that edits the chosen candidates
            values, origin, tokens = rule.revise(values, origin, tokens, step)
        rows = origin + torch.arange(n, device=device).unsqueeze(1) * k  # (n, width)
        flat = rows.view(-1)
        cand_seqs = torch.cat([seqs.index_select(0, flat), tokens.view(-1, 1)], dim=1)
        cand_attn = attn.index_select(0, flat)
        cand_hist = torch.cat([attn_hist.index_select(0, flat),
                               cand_attn[:, None, :attn_width]], dim=1)

        def path(c: int):  # candidate c's tokens and attention, without source padding
            sentence = live[c // width]
            return (cand_seqs[c, start[sentence] + 1:],
                    cand_hist[c, start[sentence]:, :lengths[sentence]])

        # e. The rule records what ended and says what runs on and which sentences are done.
        going_on, done = rule.advance(values, rows, tokens, step, cand_attn, path)
        if going_on is not None:  # (n, k) of the width candidates
            chosen = (going_on + torch.arange(n, device=device).unsqueeze(1) * width).view(-1)
            select, tokens = flat.index_select(0, chosen), tokens.view(-1).index_select(0, chosen)
            seqs, attn_hist = cand_seqs.index_select(0, chosen), cand_hist.index_select(0, chosen)
        else:
            select, seqs, attn_hist = flat, cand_seqs, cand_hist
        if any(p.stateful for p in processors):
            select_list, token_list = select.tolist(), tokens.view(-1).tolist()
            for processor in processors:
                processor.advance(select_list, token_list)
        keep = list(range(n))
        if done:
            for i, nbest in done.items():
                results[live[i]] = nbest
                if shared:  # the caller may answer it before the batch ends
                    yield "ended", live[i], nbest
            keep = [i for i in range(n) if i not in done]
            if not keep:
                break
        # f. Reorder the decoder state by the chosen origins, dropping finished sentences.
        if len(keep) < n:
            keep = fill_gaps(keep)
            kept_rows = torch.tensor([i * k + j for i in keep for j in range(k)], device=device)
            live = [live[i] for i in keep]
            rule.keep(torch.tensor(keep, device=device), kept_rows)
            select = select.index_select(0, kept_rows)
            seqs, attn_hist = seqs.index_select(0, kept_rows), attn_hist.index_select(0, kept_rows)
            if any(p.stateful for p in processors):
                rows_list = kept_rows.tolist()
                for processor in processors:
                    processor.keep(rows_list)
        if k > 1 or len(keep) < n:  # one hypothesis per sentence stays where it is
            dec.map_state(lambda state, dim: state.index_select(dim, select))
        if not shared:
            yield
    return results


def _ask(shared: bool, kind: str, owner, x: torch.Tensor):
    """``owner.step(x)`` or ``owner.log_probs(x)``; with ``shared``, asked of the caller."""
    if shared:
        return (yield kind, owner, x)
    return owner.step(x) if kind == "step" else owner.log_probs(x)


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
