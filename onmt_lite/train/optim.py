"""Adam with a learning-rate schedule: noam, rsqrt (inverse square root) or constant."""
import math

import torch


def learning_rate(step: int, base: float, decay_method: str, warmup_steps: int,
                  hidden_size: int) -> float:
    """The learning rate at ``step`` (counting from 1)."""
    step = max(step, 1)
    if decay_method == "noam":
        return base * hidden_size ** -0.5 * min(step ** -0.5, step * warmup_steps ** -1.5)
    if decay_method == "rsqrt":
        warmup = max(warmup_steps, 1)  # linear warm-up, then decay as 1/sqrt(step)
        return base * min(step / warmup, 1.0) * math.sqrt(warmup / max(step, warmup))
    if decay_method == "none":
        return base
    raise ValueError(f"unknown decay_method {decay_method!r} (noam, rsqrt, none)")


def build_optimizer(params, opt: dict) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=opt["learning_rate"],
                            betas=(opt["adam_beta1"], opt["adam_beta2"]), eps=1e-9)
