"""OpenNMT-py fixtures made to misbehave, for tests/reference/make_onmt_py_hunt.py (peers
environment) and tests/test_onmt_py_hunt.py, which write them the same way:

- ``plain``: the fixture as it is;
- ``never ends`` and ``ends at once``: the generator's bias of </s> moved (edge_variant.py);
- ``random``: every weight redrawn from a seeded generator (the positional encodings kept), so
  that </s> is rarely likeliest and the length limits are met;
- ``ties``: the generator's weights and bias of every token from TIES_FROM on copied from row
  TIES_FROM, so that those tokens' log-probabilities are exactly equal at every step.

``write_hunt_variant`` returns a digest of the weights it wrote, so that a reader can tell that
it made the same model.
"""
import argparse
import hashlib

import torch
from edge_variant import EOS_SHIFTS

KINDS = ("plain", "never ends", "ends at once", "random", "ties")
SEED = 20240531
GENERATOR_GAIN = 3.0  # random generator: logits of standard deviation about 3
TIES_FROM = 12  # the specials and the ten likeliest words keep their own rows


def _redraw(state: dict, generator: torch.Generator, gain: float = 1.0) -> dict:
    out = {}
    for key in sorted(state):
        value = state[key]
        if ".pe." in key or not value.is_floating_point():  # fixed positional encodings
            out[key] = value
        elif value.dim() >= 2:
            std = gain / value.size(-1) ** 0.5
            out[key] = torch.randn(value.shape, generator=generator) * std
        elif key.endswith("layer_norm.weight") or "layer_norm_" in key and key.endswith(".weight"):
            out[key] = 1.0 + 0.1 * torch.randn(value.shape, generator=generator)
        else:
            out[key] = 0.1 * torch.randn(value.shape, generator=generator)
    return out


def digest(ckpt: dict) -> str:
    sha = hashlib.sha256()
    for part in ("model", "generator"):
        for key in sorted(ckpt[part]):
            sha.update(key.encode())
            sha.update(ckpt[part][key].contiguous().numpy().tobytes())
    return sha.hexdigest()[:16]


def write_hunt_variant(fixture: str, path: str, kind: str) -> str:
    torch.serialization.add_safe_globals([argparse.Namespace])
    ckpt = torch.load(fixture, map_location="cpu", weights_only=True)
    if kind in EOS_SHIFTS:
        eos = ckpt["vocab"]["tgt"].index("</s>")
        bias = ckpt["generator"]["bias"].clone()
        bias[eos] += EOS_SHIFTS[kind]
        ckpt["generator"]["bias"] = bias
    elif kind == "random":
        generator = torch.Generator().manual_seed(SEED)
        ckpt["model"] = _redraw(ckpt["model"], generator)
        ckpt["generator"] = _redraw(ckpt["generator"], generator, GENERATOR_GAIN)
    elif kind == "ties":
        weight, bias = ckpt["generator"]["weight"].clone(), ckpt["generator"]["bias"].clone()
        weight[TIES_FROM:] = weight[TIES_FROM]
        bias[TIES_FROM:] = bias[TIES_FROM]
        ckpt["generator"]["weight"], ckpt["generator"]["bias"] = weight, bias
    elif kind != "plain":
        raise ValueError(f"unknown variant {kind!r}")
    torch.save(ckpt, path)
    return digest(ckpt)
