"""Layers replaced in place by other versions of themselves (bf16, oneDNN, int8 products)."""
from typing import Callable, Iterable, List, Optional, Union

from torch import nn


def swap_layers(modules: Union[nn.Module, List[nn.Module]],
                version_of: Callable[[nn.Module], Optional[nn.Module]],
                skip: Iterable[nn.Module] = ()) -> None:
    """Replaces, in place, every layer below ``modules`` (a module or a list; except those below
    a module of ``skip``) for which ``version_of(layer)`` gives a new one. A layer shared by
    several parents, or under two names of one, gets one version, shared the same way."""
    done = {}
    kept = {id(m) for part in skip for m in part.modules()}
    modules = modules if isinstance(modules, list) else [modules]
    for parent in [m for module in modules for m in module.modules()]:
        if id(parent) in kept:
            continue
        for name, child in list(parent._modules.items()):
            if id(child) not in done:
                done[id(child)] = version_of(child)
            if done[id(child)] is not None:
                setattr(parent, name, done[id(child)])
