"""DecodingOptions: a Translator's search settings, and the rules that refuse a value or a
combination of values (OptionError naming the option), for translate.py, the server and the
Python API alike."""
import argparse
from dataclasses import dataclass
from typing import Sequence

from onmt_lite.errors import OptionError
from onmt_lite.options import integer, number
from onmt_lite.search.finishing import EARLY_STOPPING
from onmt_lite.search.global_scorer import COVERAGE_PENALTIES, LENGTH_PENALTIES
from onmt_lite.search.presets import LACKS, PRESETS


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
    split_sentences: str = ""  # a language: each line a paragraph of sentences (paragraphs.py)

    def validate(self) -> None:
        """Raises OptionError naming the option of a value or combination that is refused:
        the numbers' ranges (NUMBERS), then the first of RULES that refuses."""
        check_numbers(vars(self))
        for rule in RULES:
            rule(self)


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


# -- the rules of DecodingOptions.validate, in the order they are checked ---------------------
CHOICES = (("beam_engine", ("batch", "sentence")), ("search", PRESETS),
           ("early_stopping", EARLY_STOPPING), ("length_penalty", LENGTH_PENALTIES),
           ("coverage_penalty", COVERAGE_PENALTIES))
# OpenNMT-py's own settings (name, the value that leaves it off): -search onmt only
ONMT_ONLY = (("coverage_penalty", "none"), ("beam_engine", "batch"),
             ("stepwise_penalty", False), ("length_penalty", "avg"), ("ratio", 0.0))
# settings the batch engine has and one Beam per sentence (-beam_engine sentence) lacks
BATCH_ENGINE_ONLY = ("repetition_penalty", "ban_unk_token", "ratio", "tgt_file_prefix")


def _n_best_within_beam(o: DecodingOptions) -> None:
    if o.n_best > o.beam_size:
        raise OptionError(f"-n_best must be between 1 and -beam_size ({o.beam_size})")


def _known_choices(o: DecodingOptions) -> None:
    for name, choices in CHOICES:
        if getattr(o, name) not in choices:
            raise OptionError(f"-{name} must be one of {', '.join(choices)}")


def _settings_the_search_has(o: DecodingOptions) -> None:
    for name, off in LACKS.get(o.search, {}).items():
        if getattr(o, name) != off:
            raise OptionError(f"-{name}: -search {o.search} has no such setting")


def _tf_alpha(o: DecodingOptions) -> None:
    if o.search == "tf" and o.alpha < 0:
        raise OptionError("-search tf needs -alpha 0 or more (its stop rule assumes it)")


def _onmt_only(o: DecodingOptions) -> None:
    if o.search == "onmt":
        return
    for name, off in ONMT_ONLY:
        if getattr(o, name) != off:
            raise OptionError(f"-{name} is OpenNMT-py's: not available with -search {o.search}")


def _batch_engine_only(o: DecodingOptions) -> None:
    if o.search != "onmt" or o.beam_engine != "sentence":
        return
    for name in BATCH_ENGINE_ONLY:
        if getattr(o, name) != getattr(DecodingOptions, name):
            raise OptionError(f"-{name} needs -beam_engine batch")


def _diverse_groups(o: DecodingOptions) -> None:
    if o.diverse_groups == 1:
        return
    if o.search != "fairseq":
        raise OptionError("-diverse_groups: diverse beam search is fairseq's: give "
                          "-search fairseq")
    if o.beam_size % o.diverse_groups:
        raise OptionError(f"-diverse_groups {o.diverse_groups} must divide "
                          f"-beam_size {o.beam_size}")


def _target_prefix(o: DecodingOptions) -> None:
    if o.tgt_file_prefix and o.search not in ("onmt", "ctranslate2"):
        raise OptionError(f"-tgt_file_prefix: -search {o.search} has no target prefix")


def _replace_unk_reads_attention(o: DecodingOptions) -> None:
    if o.replace_unk and not o.keep_attention:
        raise OptionError("-replace_unk reads the attention: keep_attention must be on")


def _sampling_beam(o: DecodingOptions) -> None:
    sampling = o.random_sampling_topk != 0 or o.random_sampling_topp != 0
    if sampling and o.beam_size != 1 and o.search != "hf":
        raise OptionError("random sampling needs -beam_size 1 (or -search hf: beam sampling)")


RULES = (_n_best_within_beam, _known_choices, _settings_the_search_has, _tf_alpha, _onmt_only,
         _batch_engine_only, _diverse_groups, _target_prefix, _replace_unk_reads_attention,
         _sampling_beam)
