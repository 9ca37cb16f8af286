"""Parallel text to padded, token-bounded batches."""
import random
from dataclasses import dataclass
from typing import List, Sequence, Tuple

import torch

from onmt_lite.vocab import Vocab

Example = Tuple[List[int], List[int]]


@dataclass
class Batch:
    src: torch.Tensor  # (B, S)
    src_len: torch.Tensor  # (B,)
    tgt_in: torch.Tensor  # (B, T): <s> w1 .. wn
    tgt_out: torch.Tensor  # (B, T): w1 .. wn </s>
    n_tokens: int  # target tokens, padding excluded

    def to(self, device) -> "Batch":
        return Batch(self.src.to(device), self.src_len.to(device), self.tgt_in.to(device),
                     self.tgt_out.to(device), self.n_tokens)


def make_examples(src_lines: Sequence[str], tgt_lines: Sequence[str], src_vocab: Vocab,
                  tgt_vocab: Vocab, max_len: int = 100) -> List[Example]:
    """Numericalizes line pairs, dropping pairs with an empty side or a side over ``max_len``."""
    examples = []
    for src, tgt in zip(src_lines, tgt_lines):
        s, t = src.split(), tgt.split()
        if s and t and len(s) <= max_len and len(t) <= max_len:
            examples.append((src_vocab.encode(s), tgt_vocab.encode(t)))
    return examples


def token_batches(examples: Sequence[Example], batch_tokens: int,
                  rng: random.Random = None) -> List[List[int]]:
    """Groups example indices so that sentences x longest side (+1) stays within ``batch_tokens``.

    Examples of similar length go together; with ``rng`` the order within equal lengths and the
    order of the batches are shuffled.
    """
    order = list(range(len(examples)))
    if rng is not None:
        rng.shuffle(order)
    order.sort(key=lambda i: (len(examples[i][0]), len(examples[i][1])))
    batches, current, longest = [], [], 0
    for i in order:
        size = max(len(examples[i][0]), len(examples[i][1]) + 1)
        if current and (len(current) + 1) * max(longest, size) > batch_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, size)
    if current:
        batches.append(current)
    if rng is not None:
        rng.shuffle(batches)
    return batches


def collate(examples: Sequence[Example], indices: Sequence[int], src_vocab: Vocab,
            tgt_vocab: Vocab) -> Batch:
    """Pads the chosen examples into one Batch."""
    chosen = [examples[i] for i in indices]
    src_len = torch.tensor([len(s) for s, _ in chosen])
    src = torch.full((len(chosen), int(src_len.max())), src_vocab.pad, dtype=torch.long)
    tgt_max = max(len(t) for _, t in chosen) + 1
    tgt_in = torch.full((len(chosen), tgt_max), tgt_vocab.pad, dtype=torch.long)
    tgt_out = tgt_in.clone()
    for row, (s, t) in enumerate(chosen):
        src[row, :len(s)] = torch.tensor(s)
        tgt_in[row, :len(t) + 1] = torch.tensor([tgt_vocab.bos] + t)
        tgt_out[row, :len(t) + 1] = torch.tensor(t + [tgt_vocab.eos])
    n_tokens = sum(len(t) + 1 for _, t in chosen)
    return Batch(src, src_len, tgt_in, tgt_out, n_tokens)
