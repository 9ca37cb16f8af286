"""Attention for people (-attn_debug text matrix) and for tools (-attn_dump JSON lines)."""
import json
from typing import List

import torch


def attention_matrix(src: List[str], tgt: List[str], attn: torch.Tensor) -> str:
    """Target tokens as rows, source tokens as columns; ``*`` marks each row's best source."""
    lines = ["{:>10.10} ".format("") + "".join("{:>10.7} ".format(tok) for tok in src)]
    for word, row in zip(tgt, attn.tolist()):
        best = max(range(len(row)), key=row.__getitem__) if row else -1
        cells = "".join("{:>10.7f}{}".format(v, "*" if j == best else " ") for j, v in enumerate(row))
        lines.append("{:>10.10} ".format(word) + cells)
    return "\n".join(lines) + "\n"


def attention_record(index: int, src: List[str], pred: List[str], attn: torch.Tensor) -> str:
    """One JSON line: source tokens, prediction tokens (``</s>`` included when decoded), matrix."""
    return json.dumps({"index": index, "src": src, "pred": pred,
                       "attention": [[round(v, 7) for v in row] for row in attn.tolist()]},
                      ensure_ascii=False)
