"""Several searches' decoder steps run as one (the server's continuous batching).

A server lane decodes several batches at once, each a search of its own: its hypotheses, its
finishing rule, its decoder state, its key/value cache at its own position. Their decoder steps
run together, as do their output layers. For a Transformer, the products of every layer (the
projections and the feed-forward block) take the rows of all batches in one call, and only
what reads a batch's own history runs per batch: self-attention over its cache, attention over
its source. Those products and the output layer's (hidden size x vocabulary) are most of a
step, and their cost per row falls with the rows they take, so sentences that joined at
different times share them as if they had come together.

Each row goes through the operations its decoder's own ``step`` applies (the same operations on
more rows), so a sentence's translation is the one its batch gets decoded alone: the exact
layers' operations, or the fast layers' (-fast, -int8). Decoders this module cannot join (RNNs,
ensembles, a compiled step) take their steps one after the other.
The search loop asks for these steps by yielding requests (search/loop.py, ``shared``).
"""
from typing import Callable, List, Optional, Sequence, Tuple

import torch

from onmt_lite.models.fast import FastDecoderLayer
from onmt_lite.models.model import NMTModel
from onmt_lite.models.transformer import DecoderLayer, TransformerDecoder

# What a search asks of its model between its own steps: ("step", decoder, tokens) for
# ``decoder.step(tokens)``, ("log_probs", model, out) for ``model.log_probs(out)``.
Request = Tuple[str, object, torch.Tensor]


def run_requests(requests: Sequence[Request]) -> list:
    """Each request's result, in the order asked. The steps of Transformer decoders that share
    their layers (replicas of one model) run together, as do the generators of models that
    share theirs; the others run one after the other."""
    results = [None] * len(requests)
    together = {}
    for i, (kind, owner, x) in enumerate(requests):
        key = _together(kind, owner)
        if key is None:
            results[i] = _alone(kind, owner, x)
        else:
            together.setdefault(key, []).append(i)
    for (kind, _), members in together.items():
        if len(members) == 1:
            results[members[0]] = _alone(*requests[members[0]])
            continue
        run = {"step": _transformer_steps, "fast_step": _fast_steps,
               "log_probs": _log_probs}[kind]
        for i, result in zip(members, run([requests[i][1:] for i in members])):
            results[i] = result
    return results


def _alone(kind: str, owner, x: torch.Tensor):
    return owner.step(x) if kind == "step" else owner.log_probs(x)


def _together(kind: str, owner):
    """The key of the requests that run together with this one; None: it runs alone. Steps
    of -compile -int8 decoders run together through their int8 layers (a step alone, of a few
    rows, through its program)."""
    compiled = getattr(owner, "compiled_step", None)
    if kind == "step" and isinstance(owner, TransformerDecoder) \
            and (compiled is None or compiled.few_rows_only) and not torch.is_grad_enabled():
        if all(type(layer) is DecoderLayer for layer in owner.layers):
            return kind, id(owner.layers)
        if all(type(layer) is FastDecoderLayer for layer in owner.layers):
            return "fast_step", id(owner.layers)
    if kind == "log_probs" and type(owner) is NMTModel:  # log_softmax(generator(out))
        return kind, id(owner.generator)
    return None


def _step_inputs(requests: Sequence[Tuple[TransformerDecoder, torch.Tensor]]):
    """The decoders, their rows' inputs side by side (R, 1, H), each one's self-attention mask
    and row count; positions are checked before any cache is written."""
    decoders, parts, masks = [decoder for decoder, _ in requests], [], []
    for decoder, tokens in requests:
        part, mask = decoder._inputs(tokens.unsqueeze(1), decoder.cache)
        parts.append(part)
        masks.append(mask)
    return decoders, torch.cat(parts), masks, [part.size(0) for part in parts]


def _step_outputs(decoders, x: torch.Tensor, attns: list, sizes: List[int]) -> list:
    """Each decoder's (output, attention) of its rows of ``x``, its position advanced."""
    results = []
    for decoder, out, attn in zip(decoders, decoders[0].layer_norm(x).squeeze(1).split(sizes),
                                  attns):
        decoder._advance(1)
        attn = attn[:, 0].reshape(out.size(0), -1)  # head 0 of the last layer, as forward's
        results.append((decoder.cache.from_buffer(out), decoder.cache.from_buffer(attn)))
    return results


def _fast_steps(requests: Sequence[Tuple[TransformerDecoder, torch.Tensor]]):
    """TransformerDecoder.step of decoders whose layers are FastDecoderLayers (-fast, -int8),
    as FastDecoderLayer.forward makes it: its products on every decoder's rows at once."""
    decoders, x, masks, sizes = _step_inputs(requests)
    attns = None
    for i, layer in enumerate(decoders[0].layers):
        q, keys, values = layer.project(x)
        contexts = []
        for decoder, qq, kk, vv, mask in zip(decoders, q.split(sizes), keys.split(sizes),
                                              values.split(sizes), masks):
            kk, vv = decoder.cache.append(i, kk, vv)
            contexts.append(layer.self_attn.merge_heads(layer.self_attention(qq, kk, vv, mask),
                                                        qq.size(0), 1))
        query, q = layer.between(torch.cat(contexts), x)
        contexts, attns = [], []
        for decoder, qq in zip(decoders, q.split(sizes)):
            state = decoder.state
            context, attn = layer.context_attention(
                qq, state[f"memory_keys.{i}"], state[f"memory_values.{i}"], state["src_mask"],
                decoder.group)
            contexts.append(context)
            attns.append(attn)
        x = layer.finish(torch.cat(contexts), query)
    return _step_outputs(decoders, x, attns, sizes)


def _log_probs(requests: Sequence[Tuple[NMTModel, torch.Tensor]]) -> List[torch.Tensor]:
    outs = [out for _, out in requests]
    return list(requests[0][0].log_probs(torch.cat(outs)).split([o.size(0) for o in outs]))


def _transformer_steps(requests: Sequence[Tuple[TransformerDecoder, torch.Tensor]]):
    """TransformerDecoder.step (its forward for one token a row), for several decoders."""
    decoders, x, masks, sizes = _step_inputs(requests)
    attns = None
    for i, layer in enumerate(decoders[0].layers):
        self_attn, context_attn = layer.self_attn, layer.context_attn
        normed = layer.before(layer.layer_norm_1, x)
        queries = self_attn.project_query(normed).split(sizes)
        keys, values = self_attn.project_kv(normed)
        contexts = []
        for decoder, q, k, v, mask in zip(decoders, queries, keys.split(sizes),
                                          values.split(sizes), masks):
            k, v = decoder.cache.append(i, k, v)
            context, _ = self_attn.attention(q, k, v, mask)
            contexts.append(self_attn.merge_heads(context, q.size(0), 1))
        self_out = self_attn.final_linear(torch.cat(contexts))
        query = layer.after(layer.layer_norm_1, layer.dropout(self_out) + x)
        queries = context_attn.project_query(layer.before(layer.layer_norm_2, query)).split(sizes)
        contexts, attns = [], []
        for decoder, q in zip(decoders, queries):
            state = decoder.state
            context, attn = context_attn.attention(
                q, state[f"memory_keys.{i}"], state[f"memory_values.{i}"], state["src_mask"],
                decoder.group)
            contexts.append(context_attn.merge_heads(context, q.size(0), 1))
            attns.append(attn)
        context = context_attn.final_linear(torch.cat(contexts))
        x = layer.feed_forward(layer.after(layer.layer_norm_2, layer.dropout(context) + query))
    return _step_outputs(decoders, x, attns, sizes)


class Searches:
    """Searches that run side by side: step generators in shared mode (search_steps), whose
    requests run together at each step. ``add`` and ``step`` return what happened, as (tag,
    kind, value): ("ended", (sentence, its result)) for each sentence that ended, ("done", what
    the search returned) or ("error", the exception it raised) for each search that ended,
    after ("unjoined", what was offered to it) where it ended with offers it had not taken.
    One search's error ends only that search. Call them under ``inference()``.

    A search that asks ``("join",)`` between its steps takes sentences into itself: ``offer``
    hands it what it takes at its next such request, reported as ("joined", what it took)."""

    def __init__(self):
        self.running: List[list] = []  # [tag, generator, its next request]
        self.joining = set()  # the tags of searches that take sentences between steps
        self.offers = {}  # tag -> what it takes at its next join

    def __len__(self) -> int:
        return len(self.running)

    def tags(self) -> list:
        return [tag for tag, _, _ in self.running]

    def offer(self, tag, batch) -> bool:
        """Queues ``batch`` for the running search ``tag`` to take at its next join; False if
        it takes none."""
        if tag not in self.joining:
            return False
        self.offers.setdefault(tag, []).append(batch)
        return True

    def add(self, tag, steps) -> List[tuple]:
        """Starts ``steps``: it runs to its first request (the encoder runs here)."""
        return self._advance([[tag, steps, None]], [None])

    def remove(self, tag) -> None:
        """Stops the search ``tag`` (its sentences are no longer wanted); what was offered to
        it and not taken is dropped too."""
        for search in [s for s in self.running if s[0] is tag]:
            self.running.remove(search)
            search[1].close()
        self.joining.discard(tag)
        self.offers.pop(tag, None)

    def step(self, only: Optional[Callable[[object], bool]] = None) -> List[tuple]:
        """Runs every search's request (or those whose tag ``only`` accepts), together, and
        each of those searches on to its next request."""
        stepping = [search for search in self.running if only is None or only(search[0])]
        requests = [request for _, _, request in stepping]
        try:
            results = run_requests(requests)
        except Exception:  # noqa: BLE001 - found again request by request
            results = [_alone_or_error(request) for request in requests]
        chosen = {id(search) for search in stepping}
        self.running = [search for search in self.running if id(search) not in chosen]
        return self._advance(stepping, results)

    def _advance(self, searches: List[list], results: list) -> List[tuple]:
        events = []
        for search, result in zip(searches, results):
            tag, steps, _ = search
            try:
                request = steps.throw(result) if isinstance(result, Exception) \
                    else steps.send(result)
                while request[0] in ("ended", "join"):  # nothing to run for these
                    if request[0] == "ended":
                        events.append((tag, "ended", request[1:]))
                        request = steps.send(None)
                    else:
                        self.joining.add(tag)
                        taken = self.offers.pop(tag, None)
                        if taken is not None:
                            events.append((tag, "joined", taken))
                        request = steps.send(taken)
                search[2] = request
                self.running.append(search)
                continue
            except StopIteration as end:
                ending = (tag, "done", end.value)
            except Exception as err:  # noqa: BLE001 - the search's own error, returned
                ending = (tag, "error", err)
            self.joining.discard(tag)
            if tag in self.offers:
                events.append((tag, "unjoined", self.offers.pop(tag)))
            events.append(ending)
        return events


def _alone_or_error(request: Request):
    """The request run on its own, or the exception it raises. The one error a step raises, a
    position past the model's table, comes before any state is written."""
    try:
        return _alone(*request)
    except Exception as err:  # noqa: BLE001
        return err
