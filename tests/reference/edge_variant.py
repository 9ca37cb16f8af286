"""OpenNMT-py fixtures made to misbehave, for edge references: the generator's bias of </s>
moved, so that no hypothesis ends by itself ("never ends") or </s> is likeliest from the first
step ("ends at once"). Both tests/reference/make_onmt_py_edges.py (peers environment) and the
tests write them the same way."""
import argparse

import torch

EOS_SHIFTS = {"never ends": -30.0, "ends at once": 12.0}


def write_edge_variant(fixture: str, path: str, shift: str) -> None:
    torch.serialization.add_safe_globals([argparse.Namespace])
    ckpt = torch.load(fixture, map_location="cpu", weights_only=True)
    eos = ckpt["vocab"]["tgt"].index("</s>")
    bias = ckpt["generator"]["bias"].clone()
    bias[eos] += EOS_SHIFTS[shift]
    ckpt["generator"]["bias"] = bias
    torch.save(ckpt, path)
