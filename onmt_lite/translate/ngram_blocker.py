"""NgramBlocker: forbids tokens that would repeat an n-gram of a hypothesis (OpenNMT-py's rule).

Each hypothesis row keeps its token sequence and a table {(n-1)-gram: next tokens seen}; n-grams
that touch an exempt token are not recorded. Rows follow their hypotheses through ``update``.
"""
from typing import Dict, List, Sequence, Set

import torch

from onmt_lite.constants import BLOCKED_SCORE


class NgramBlocker:
    def __init__(self, n: int, rows: int, bos: int, exempt: frozenset = frozenset()):
        self.n, self.exempt = n, exempt
        self.seqs: List[List[int]] = [[bos] for _ in range(rows)]
        self.tables: List[Dict[tuple, Set[int]]] = [dict() for _ in range(rows)]

    def _key(self, seq: List[int]) -> tuple:
        return tuple(seq[len(seq) - (self.n - 1):]) if self.n > 1 else ()

    def block(self, scores: torch.Tensor) -> None:
        """Sets BLOCKED_SCORE on the tokens each row (scores (rows, V)) must not produce."""
        if len(self.seqs[0]) < self.n:
            return
        for row, (seq, table) in enumerate(zip(self.seqs, self.tables)):
            banned = table.get(self._key(seq))
            if banned:
                scores[row, list(banned)] = BLOCKED_SCORE

    def update(self, origins: Sequence[int], tokens: Sequence[int]) -> None:
        """Row r becomes row ``origins[r]`` extended by ``tokens[r]``."""
        seqs, tables = [], []
        for origin, token in zip(origins, tokens):
            seq = self.seqs[origin] + [token]
            table = {key: set(next_tokens) for key, next_tokens in self.tables[origin].items()}
            ngram = seq[-self.n:]
            if len(seq) >= self.n and not set(ngram) & self.exempt:
                table.setdefault(tuple(ngram[:-1]), set()).add(ngram[-1])
            seqs.append(seq)
            tables.append(table)
        self.seqs, self.tables = seqs, tables

    def keep(self, rows: Sequence[int]) -> None:
        """Keeps only ``rows`` (hypotheses of sentences that leave the batch are dropped)."""
        self.seqs = [self.seqs[r] for r in rows]
        self.tables = [self.tables[r] for r in rows]
