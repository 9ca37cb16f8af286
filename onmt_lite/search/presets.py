"""Presets: each toolkit's beam search as a frozen record of choices, and the Search it builds.

Under a preset the shared flags mean what that toolkit's parameter of the same role means
(docs/search.md, "Search presets"). ``onmt`` is OpenNMT-py 3.5.1; ``hf`` is Hugging Face
``generate`` (transformers 5): greedy when ``-beam_size`` is 1, as ``num_beams=1`` is;
``fairseq`` is fairseq 0.12's ``SequenceGenerator`` (``DiverseBeamSearch`` with
``-diverse_groups``); ``ctranslate2`` is CTranslate2 4.x's ``translate_batch``; ``tf`` is the
beam search of TensorFlow's official models (``official/nlp/modeling/ops/beam_search.py``, GNMT
length normalisation).
"""
from dataclasses import dataclass
from typing import Any, Optional, Tuple

import torch

from onmt_lite.constants import FINISHED_SCORE
from onmt_lite.errors import OptionError
from onmt_lite.search.candidates import Argmax, BeamSampler, Sampler, TopK
from onmt_lite.search.finishing import (
    AliveFinished,
    DiverseGroups,
    FirstFinished,
    OnmtSlots,
    RefillBeams,
    ReplaceFinished,
)
from onmt_lite.search.global_scorer import GNMTGlobalScorer
from onmt_lite.search.loop import Search
from onmt_lite.search.processors import (
    NEG_INF,
    BannedTokens,
    BanToken,
    ForcedEOS,
    MinLength,
    NgramBlocker,
    NoRepeatNgram,
    Renormalise,
    RepetitionPenalty,
    TargetPrefix,
    Warper,
)


@dataclass(frozen=True)
class Preset:
    """The choices that make one toolkit's search.

    rule: ``slots`` (OpenNMT-py: a finished hypothesis holds its slot), ``refill`` (Hugging
        Face: 2k candidates, the k best running ones go on), ``first`` (fairseq: the same, the
        first k finished kept), ``replace`` (CTranslate2: 2k
        candidates, a finished one's slot taken by the next running one) or ``alive``
        (TensorFlow: 2k candidates, alive and finished sets, a bound to stop).
    min_length_score: what ``</s>`` gets before ``-min_length`` tokens.
    ngram_block: ``onmt`` (on candidate scores, -ignore_when_blocking exempt) or
        ``no_repeat`` (no_repeat_ngram_size: on log-probs, -inf).
    ban_renormalises: banned tokens leave the others' log-probs summing to 1.
    bans_pad: the padding token is never generated (its log-prob -inf, not renormalised).
    on_logits: processors act on logits, log-softmax follows: ``never``, ``greedy`` (with one
        hypothesis, as Hugging Face's ``num_beams=1``) or ``always``.
    count_start: the decoder's start token is part of the history that repetition rules see.
    defaults: the toolkit's own defaults of shared options, for the options not given (none
        but OpenNMT-py limits the length by the source's: -max_length_ratio 0 for the others).
    """
    name: str
    rule: str
    min_length_score: float
    ngram_block: str
    ban_renormalises: bool
    on_logits: str = "never"
    count_start: bool = True
    bans_pad: bool = False
    defaults: Tuple[Tuple[str, Any], ...] = (("max_length_ratio", 0.0),)


PRESETS = {
    "onmt": Preset("onmt", "slots", FINISHED_SCORE, "onmt", ban_renormalises=True,
                   defaults=()),
    "hf": Preset("hf", "refill", NEG_INF, "no_repeat", ban_renormalises=False,
                 on_logits="greedy",
                 # GenerationConfig: num_beams=1, max_length=20 (the decoder's start counted)
                 defaults=(("max_length_ratio", 0.0), ("beam_size", 1), ("max_length", 19))),
    "fairseq": Preset("fairseq", "first", NEG_INF, "no_repeat", ban_renormalises=False,
                      bans_pad=True,
                      # SequenceGenerator's signature: max_len_a=0, max_len_b=200, min_len=1
                      defaults=(("max_length_ratio", 0.0), ("max_length", 200),
                                ("min_length", 1))),
    "ctranslate2": Preset("ctranslate2", "replace", NEG_INF, "no_repeat",
                          ban_renormalises=False, on_logits="always", count_start=False,
                          # translate_batch's signature: beam_size=2,
                          # max_decoding_length=256, min_decoding_length=1
                          defaults=(("max_length_ratio", 0.0), ("beam_size", 2),
                                    ("max_length", 256), ("min_length", 1))),
    "tf": Preset("tf", "alive", NEG_INF, "none", ban_renormalises=False),
}
# what each preset's toolkit lacks: these options must keep their "off" value under it
LACKS = {"tf": {"min_length": 0, "block_ngram_repeat": 0, "repetition_penalty": 1.0,
                "ban_unk_token": False},
         "fairseq": {"repetition_penalty": 1.0, "ban_unk_token": False}}


def build_search(preset: Preset, opt, *, batch: int, vocab, max_length: int,
                 exempt: frozenset = frozenset(), sampler: Optional[Sampler] = None,
                 prefixes: Optional[torch.Tensor] = None) -> Search:
    """The Search for one batch of ``batch`` sentences under ``preset`` and DecodingOptions
    ``opt`` (its shared flags read in the preset's meaning), with target Vocab ``vocab``.

    Args:
        prefixes: (batch, P) forced target prefixes (-tgt_file_prefix), ``</s>`` then padding
            after each.
    """
    bos, eos, banned = vocab.bos, vocab.eos, opt.banned_tokens
    k = opt.beam_size
    greedy = k == 1
    on_logits = preset.on_logits == "always" or (preset.on_logits == "greedy" and greedy)
    processors = []  # in Hugging Face's order; a renormalising ban comes first
    if preset.bans_pad:
        banned = sorted(set(banned) | {vocab.pad})
    if banned:
        processors.append(BannedTokens(banned, preset.ban_renormalises and not on_logits))
    if opt.repetition_penalty != 1.0:
        processors.append(RepetitionPenalty(opt.repetition_penalty, preset.count_start))
    if opt.block_ngram_repeat > 0 and preset.ngram_block == "no_repeat":
        processors.append(NoRepeatNgram(opt.block_ngram_repeat, preset.count_start))
    if opt.min_length > 0:
        processors.append(MinLength(opt.min_length, eos, preset.min_length_score))
    if opt.ban_unk_token:
        processors.append(BanToken(vocab.unk, preset.min_length_score))
    if opt.forced_eos:
        processors.append(ForcedEOS(max_length, eos))
    if preset.rule == "first":  # after max_length tokens, </s> (with its own log-prob)
        processors.append(ForcedEOS(max_length + 1, eos, keep_score=True))
    beam_sampling = sampler is not None and not greedy
    if beam_sampling:
        if preset.name != "hf":
            raise OptionError(f"sampling in a beam needs -search hf, not {preset.name}")
        processors.append(Warper(sampler.temperature, sampler.topk, sampler.topp, min_keep=2))
    if opt.renormalize_logits and preset.name == "hf":
        processors.append(Renormalise())
    candidate_processors = []
    if opt.block_ngram_repeat > 0 and preset.ngram_block == "onmt":
        candidate_processors.append(NgramBlocker(opt.block_ngram_repeat, batch * k, bos, exempt))
    if prefixes is not None and preset.rule not in ("slots", "replace"):
        raise OptionError(f"-tgt_file_prefix: not available with -search {preset.name}")
    if prefixes is not None and preset.rule == "slots":
        candidate_processors.append(
            TargetPrefix(prefixes.repeat_interleave(k, dim=0), eos, vocab.pad))
    if preset.rule == "slots" or (greedy and preset.rule == "refill"):
        penalties = ("none", "none") if preset.rule != "slots" else (
            opt.length_penalty, opt.coverage_penalty)
        scorer = GNMTGlobalScorer(opt.alpha, opt.beta, *penalties)
        rule = OnmtSlots(scorer, eos, max_length, opt.n_best,
                         stepwise_penalty=opt.stepwise_penalty and not greedy,  # as OpenNMT-py
                         ratio=0.0 if greedy else opt.ratio)
        # generate()'s greedy search takes argmax: the lowest id among equal scores
        selection = sampler or (Argmax() if preset.rule == "refill" else TopK())
    elif preset.rule == "refill":
        rule = RefillBeams(eos, max_length, opt.n_best, opt.alpha, opt.early_stopping)
        selection = BeamSampler(sampler.generator) if beam_sampling else TopK(
            width_factor=rule.width_factor, exact=True)
    elif preset.rule == "first" and opt.diverse_groups > 1:
        rule = DiverseGroups(eos, max_length, opt.n_best, opt.alpha, opt.diverse_groups,
                             opt.diverse_strength)
        selection = rule
    elif preset.rule == "first":
        rule = FirstFinished(eos, max_length, opt.n_best, opt.alpha)
        selection = TopK(width_factor=rule.width_factor, exact=True)
    elif preset.rule == "replace":
        if prefixes is not None and bool(prefixes[:, 0].eq(eos).all()):
            # CTranslate2 4.x, src/decoding.cc split_start_tokens: a batch whose lines have no
            # target prefix decodes as one without ("if (only_start_token) prefix_ids.clear()"):
            # no </s> penalised at the first step
            prefixes = None
        # greedy: src/decoding.cc make_search_strategy takes GreedySearch for beam_size 1, which
        # has no patience: a sentence ends at its first </s> (GreedySearch::search, is_finished)
        rule = ReplaceFinished(eos, max_length, opt.n_best, opt.alpha,
                               1.0 if greedy else opt.patience, prefixes)
        # greedy: CTranslate2's GreedySearch takes TopK(1), a std::partial_sort over the
        # vocabulary (src/ops/topk_cpu.cc) that keeps the first of equal maxima
        selection = TopK(width_factor=rule.width_factor, exact=True, lowest_first=greedy)
    else:
        rule = AliveFinished(eos, max_length, opt.n_best, opt.alpha)
        # official/nlp/modeling/ops/beam_search.py _grow_alive_seq: tf.nn.top_k over the beam x
        # vocabulary, which puts the lower index first among equal scores
        selection = TopK(width_factor=rule.width_factor, exact=True, lowest_first=True)
    return Search(rule, processors, candidate_processors, selection, on_logits)
