"""Ensembles: several models with one vocabulary decode as one (OpenNMT-py's ``-model a b``).

Each model keeps its own encoder output and decoder state; a step runs every decoder and the
attention is the mean of theirs. The next-token distribution is OpenNMT-py 3.5.1's: the
log-softmax of the mean of the models' generator outputs (their logits: OpenNMT-py's generator
is the linear layer), or with ``raw_probs`` of the log of the mean of their exponentials.
"""
from typing import List, Sequence

import torch
from torch import nn

from onmt_lite.models.model import NMTModel, replica


class EnsembleDecoder:
    """The decoder surface a search uses (init_state, step, map_state), over every model's."""

    def __init__(self, decoders: Sequence[nn.Module]):
        self.decoders = list(decoders)

    def init_state(self, src_len, memories: List, finals: List) -> None:
        for decoder, memory, final in zip(self.decoders, memories, finals):
            decoder.init_state(src_len, memory, final)

    def step(self, tokens: torch.Tensor):
        """-> (each model's output, mean attention)."""
        outs, attns = zip(*(decoder.step(tokens) for decoder in self.decoders))
        return list(outs), torch.stack([a.float() for a in attns]).mean(0)

    def map_state(self, fn) -> None:
        for decoder in self.decoders:
            decoder.map_state(fn)

    def __call__(self, tgt_in: torch.Tensor):
        outs, attns = zip(*(decoder(tgt_in) for decoder in self.decoders))
        return list(outs), torch.stack([a.float() for a in attns]).mean(0)


class EnsembleModel:
    """Models that share their vocabularies, decoding as one."""

    def __init__(self, models: Sequence[NMTModel], raw_probs: bool = False):
        self.models, self.raw_probs = list(models), raw_probs
        self.decoder = EnsembleDecoder([m.decoder for m in self.models])

    def joinable(self) -> bool:
        return False  # each decoder would join on its own: not built

    def encode(self, src: torch.Tensor, src_len: torch.Tensor):
        memories, finals = zip(*(m.encode(src, src_len) for m in self.models))
        return list(memories), list(finals)

    def log_probs(self, outs: List[torch.Tensor]) -> torch.Tensor:
        logits = torch.stack([m.generator(out).float() for m, out in zip(self.models, outs)])
        combined = logits.exp().mean(0).log() if self.raw_probs else logits.mean(0)
        return torch.log_softmax(combined, dim=-1)

    def __call__(self, src, src_len, tgt_in):
        memories, finals = self.encode(src, src_len)
        self.decoder.init_state(src_len, memories, finals)
        outs, attn = self.decoder(tgt_in)
        return self.log_probs(outs), attn

    def replica(self) -> "EnsembleModel":
        return EnsembleModel([replica(m) for m in self.models], self.raw_probs)
