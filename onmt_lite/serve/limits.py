"""The server's bounds on what its clients and its configuration may ask for, each checked before
any work starts: request sizes (Limits), and the decoding options of every served model and of
every search a request starts (SearchLimits)."""
import os
from dataclasses import dataclass
from typing import List, Optional

from onmt_lite.errors import OptionError

MIB = 1 << 20
# What a lane holds of a model beside the weights it maps (the model's objects, the replicas and
# the working memory of its searches): 11 MiB beside 46 MiB of weights, the Transformer fixture
# after a translation; a quarter of the weights a lane.
LANE_SHARE = 0.25


class LimitError(OptionError):
    """A request, a clone or a conf.json that asks for more than the server's limits; the
    message names the limit (and its option)."""


@dataclass
class Limits:
    """What one HTTP request may hold."""
    max_request_bytes: int = 1 << 20  # a larger body: 413
    max_sentences: int = 128  # texts (q list items, /translator inputs) per request
    max_chars: int = 5000  # characters per text
    timeout: float = 60.0  # seconds a request may wait for its translations: then 503
    max_queue: int = 1024  # sentences waiting per model: beyond, 503 with Retry-After
    max_connections: int = 512  # requests in flight: beyond, 503 with Retry-After (0: no limit)
    max_file_bytes: int = 1 << 20  # an uploaded file's bytes at most (/translate_file): 413
    max_stored_files: int = 256  # translated files waiting for their download at most


@dataclass
class SearchLimits:
    """What a served model's options (from the command line, a conf.json or a client's
    clone_model) may set, and the search memory one request may need in a lane.

    Attributes:
        max_beam_size, max_target_length, max_batch_size: bounds on beam_size (and n_best,
            at most the beam size), max_length and batch_size.
        lane_memory: MiB a lane's search may use for one request's sentences (their rows'
            output scores, decoder caches, source memories and attention); a request that
            would need more is refused.
        max_models: models the server holds at most, the configured ones and clones.
        max_memory: MiB the models loaded may hold (model_memory); the least recently used
            are unloaded to keep within it (0: no bound).
    """
    max_beam_size: int = 64
    max_target_length: int = 1024
    max_batch_size: int = 256
    lane_memory: int = 2048
    max_models: int = 8
    max_memory: int = 0

    def check_options(self, options, where: str) -> None:
        """Refuses translate options (a namespace) beyond the bounds, naming the option."""
        for name, value, bound, flag in (
                ("beam_size", options.beam_size, self.max_beam_size, "-max_beam_size"),
                ("n_best", options.n_best, self.max_beam_size, "-max_beam_size"),
                ("max_length", options.max_length, self.max_target_length, "-max_target_length")):
            if value > bound:
                raise LimitError(f"{where}: {name} {value} is over the server's limit of "
                                 f"{bound} ({flag})")

    def check_batch_size(self, batch_size: int, where: str) -> None:
        if batch_size > self.max_batch_size:
            raise LimitError(f"{where}: batch_size {batch_size} is over the server's limit of "
                             f"{self.max_batch_size} (-max_batch_size)")

    def check_memory(self, shape: "SearchShape", beam_size: int, source_lengths: List[int],
                     target_length: int, batch_size: int, where: str) -> None:
        """Refuses a request whose sentences (``source_lengths`` tokens, decoded in batches of
        ``batch_size``, up to ``target_length`` steps) would need more than ``lane_memory`` MiB
        in the batch that needs most."""
        largest = sorted(source_lengths, reverse=True)[:batch_size]
        need = sum(shape.sentence_bytes(beam_size, s, target_length) for s in largest)
        if need > self.lane_memory * MIB:
            raise LimitError(f"{where}: its search would need about {need / MIB:,.0f} MiB, over "
                             f"the server's limit of {self.lane_memory} MiB a request "
                             "(-lane_memory)")


def model_memory(weights: int, lanes: int, shared: bool) -> int:
    """The bytes a loaded model holds, from the bytes of its ``weights``: once, in the file
    every lane maps (``shared``; else a copy in each lane), and LANE_SHARE of them in each of
    the ``lanes``."""
    per_lane = LANE_SHARE * weights + (0 if shared else weights)
    return int((weights if shared else 0) + lanes * per_lane)


def default_max_memory() -> int:
    """Half the machine's memory, in MiB (0, no bound, where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2 // MIB
    except (AttributeError, ValueError, OSError):
        return 0


@dataclass(frozen=True)
class SearchShape:
    """The sizes that make a search's memory: the target vocabulary, the decoder's width and
    layers (summed over an ensemble's members)."""
    vocab: int
    width: int
    layers: int

    @classmethod
    def of(cls, model) -> Optional["SearchShape"]:
        members = getattr(model, "models", None) or [model]
        try:
            vocab = members[0].generator.out_features
            width = sum(m.generator.in_features for m in members)
            layers = max(len(getattr(m.decoder, "layers", [None])) for m in members)
        except AttributeError:
            return None
        return cls(vocab, width, layers)

    def sentence_bytes(self, beam_size: int, source: int, target: int) -> int:
        """A generous estimate of one sentence's search memory, in bytes (float32): per row,
        the step's scores over the vocabulary (log-probabilities, their sum with the beam's,
        the candidates: 4 copies), the memory and each layer's keys and values of it, each
        layer's cached keys and values over ``target`` steps, and attention rows."""
        per_row = 4 * (4 * self.vocab + (1 + 2 * self.layers) * self.width * source
                       + 2 * self.layers * self.width * target + source * target)
        return beam_size * per_row
