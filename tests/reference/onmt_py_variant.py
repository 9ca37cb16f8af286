"""A second OpenNMT-py Transformer with the fixture's vocabulary, for ensemble references: the
fixture with its decoder's first feed-forward layer and its generator scaled by 0.9. Both
tests/reference/make_onmt_py.py (peers environment) and the tests write it the same way."""
import argparse

import torch

SCALED = ("decoder.transformer_layers.0.feed_forward.w_1.weight",)


def write_variant(fixture: str, path: str) -> None:
    torch.serialization.add_safe_globals([argparse.Namespace])
    ckpt = torch.load(fixture, map_location="cpu", weights_only=True)
    for key in SCALED:
        ckpt["model"][key] = ckpt["model"][key] * 0.9
    ckpt["generator"]["weight"] = ckpt["generator"]["weight"] * 0.9
    torch.save(ckpt, path)
