"""Programs compiled ahead of time by AOTInductor (``-compile``): a Builder exports a module,
compiles it and keeps the package on disk, or loads the package an earlier process made.

Packages are named after what they are made of (compiled_step._name), so a cache directory
serves every model, precision, torch and CPU it has met; a crash never leaves half a package
under its name.
"""
import contextlib
import ctypes
import functools
import logging
import mmap
import os
import shutil
import sys
import tempfile
import threading
import weakref
import zipfile
from typing import Callable, Optional

import torch
from torch import nn

logger = logging.getLogger("onmt_lite")

# a builder: (a program's module, example arguments, a function giving their dynamic shapes (a
# cached program is loaded without importing sympy: 0.3 s), a name for what
# the program is made of[, inline products]) -> a function of the same arguments returning the
# outputs as a list
Builder = Callable[..., Callable]

DEFAULT_CACHE = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")),
                             "onmt_lite", "compiled")
# the user's choice, read before Inductor's import sets the variable to its own default
USER_CACHE = os.environ.get("TORCHINDUCTOR_CACHE_DIR")


def compiler_problem() -> Optional[str]:
    """Why -compile cannot build CPU code here, or None if it can: no C++ compiler (Inductor's
    setting if it is loaded, else its default, $CXX or g++, clang++ on macOS). Inductor itself
    (2 s to import) is imported only to compile, not to load a compiled package."""
    config = sys.modules.get("torch._inductor.config")
    if config is not None:
        cxx = config.cpp.cxx
        candidates = [c for c in (cxx if isinstance(cxx, (list, tuple)) else (cxx,)) if c]
    else:
        candidates = [os.environ.get("CXX", "clang++" if sys.platform == "darwin" else "g++")]
    if not any(shutil.which(c) for c in candidates):
        return f"no C++ compiler found (looked for {', '.join(candidates)}; set CXX to one)"
    return None


class NotInCache(Exception):
    """A program that a builder which only loads (``build_missing`` off) did not find."""


def aot_compiler(cache_dir: str = "", build_missing: bool = True) -> Optional[Builder]:
    """A Builder that exports a step program, compiles it by AOTInductor (frozen, serial code)
    and keeps the package in ``cache_dir`` (default: the user's cache), or loads the package a
    previous process made; without ``build_missing``, raises NotInCache for a program not
    made yet. Where no compiler is found, says so in one line and returns None."""
    problem = compiler_problem()
    if problem:
        logger.warning("-compile: %s: the model runs uncompiled", problem)
        return None
    directory = os.path.abspath(cache_dir or USER_CACHE or DEFAULT_CACHE)

    def build(module: nn.Module, args: tuple, shapes: Callable[[], dict], name: str,
              inline: bool = False) -> Callable:
        path = os.path.join(directory, f"{name}.pt2")
        if not os.path.exists(path):
            if not build_missing:
                raise NotInCache(f"{name} is not in the compile cache {directory} yet")
            os.makedirs(directory, exist_ok=True)
            logger.info("-compile: compiling %s (once: kept in %s)", name, directory)
            from torch._inductor import aoti_compile_and_package, config
            settings = {"cpp.threads": 1, "freezing": True, "compile_threads": 1}
            if inline:
                settings.update(INLINE_PRODUCTS)
            with torch.inference_mode(False), torch.no_grad(), config.patch(settings), \
                    _inline_products(inline):
                program = torch.export.export(module, args, dynamic_shapes=shapes())
                partial = f"{path[:-4]}.{os.getpid()}.partial.pt2"  # the name must end in .pt2
                aoti_compile_and_package(program, package_path=partial)
            os.replace(partial, path)  # a crash never leaves half a package under its name
        return load_package(path, next((p.device.type for p in module.parameters()), "cpu"))
    return build


# Inline products: Inductor's own C++ matrix-product template, its weights packed in blocks,
# compiled into the program; a product of a few rows then costs no call into a library. At 2-6
# rows of the Argos package's 192 x 192 to 192 x 768 products, 1.5-21 us against oneDNN's
# 15-25 us (AMD EPYC, one thread); past some tens of rows the libraries win, so only programs
# for a few rows take them (compiled_step.SMALL_ROWS).
INLINE_PRODUCTS = {"max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"}
_inline = threading.local()


@functools.lru_cache(maxsize=None)
def _add_template_first() -> None:
    """Hands Inductor _template_first, once a process."""
    from torch._inductor import select_algorithm
    select_algorithm.add_preprocessing_fn(_template_first)


@contextlib.contextmanager
def _inline_products(on: bool):
    """While on, every product that Inductor's C++ template can make takes it, without timing
    it against the library call (which would compile each candidate: seconds a product)."""
    _add_template_first()
    _inline.on = on
    try:
        yield
    finally:
        _inline.on = False


def _template_first(choices: list) -> list:
    """Inductor's choices for one product: only its C++ template's, where it has them and
    inline products are on; else all of them."""
    if not getattr(_inline, "on", False):
        return choices
    return [c for c in choices if c.name.startswith("cpp_")] or choices


def load_package(path: str, device: str = "cpu") -> Callable:
    """An AOTInductor package's program, as a function of the exported module's arguments
    (tensors and lists of tensors) that returns its outputs as a list.

    The package's shared library is called through its C entry points by ctypes, which lets go
    of the interpreter lock for the call: torch's loaders hold it throughout, so two threads'
    steps (-inter_threads) would take turns (twice -fast's time on two cores). The container
    holds one model per core, so that threads sharing the program never wait for each other.
    torch's own loader serves a GPU's programs, and where the library cannot be called so."""
    if device == "cpu":
        try:
            return _ctypes_program(path)
        except (OSError, AttributeError, ValueError, ImportError) as problem:
            logger.debug("-compile: %s by torch's loader (%s)", path, problem)
    try:
        from torch._C._aoti import AOTIModelPackageLoader
    except ImportError:
        from torch._inductor import aoti_load_package
        return aoti_load_package(path)
    run = AOTIModelPackageLoader(path, "model", False, _cores(), -1).boxed_run

    def program(*args):
        return run([t for arg in args for t in (arg if isinstance(arg, list) else [arg])])
    return program


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)


def _ctypes_program(path: str) -> Callable:
    """load_package's program, by the package's library called through ctypes. The library is
    unpacked to a private temporary file, loaded and unlinked (its constants are inside it)."""
    from torch._C import _aoti
    with zipfile.ZipFile(path) as package:
        member, = (n for n in package.namelist() if n.endswith(".so"))
        with tempfile.NamedTemporaryFile(suffix=".so") as unpacked:
            shutil.copyfileobj(package.open(member), unpacked)
            unpacked.flush()
            library = ctypes.CDLL(unpacked.name)
    handle = ctypes.c_void_p()
    _check(library.AOTInductorModelContainerCreateWithDevice(
        ctypes.byref(handle), ctypes.c_size_t(_cores()), b"cpu", None))
    _drop_constants_image(library)
    count = ctypes.c_size_t()
    _check(library.AOTInductorModelContainerGetNumOutputs(handle, ctypes.byref(count)))
    outputs = count.value
    run = library.AOTInductorModelContainerRun
    run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                    ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p]
    give, take = _aoti.unsafe_alloc_void_ptrs_from_tensors, \
        _aoti.alloc_tensors_by_stealing_from_void_ptrs  # tensor handles, as capsules
    address, capsule = _capsule_functions()

    def program(*args):
        tensors = [t for arg in args for t in (arg if isinstance(arg, list) else [arg])]
        # handles of new references to the tensors, which the program releases
        handles = (ctypes.c_void_p * len(tensors))(*[address(h, None) for h in give(tensors)])
        results = (ctypes.c_void_p * outputs)()
        _check(run(handle, handles, len(tensors), results, outputs, None, None))
        return take([capsule(r, None, None) for r in results])
    weakref.finalize(program, library.AOTInductorModelContainerDelete, handle)
    return program


@functools.lru_cache(maxsize=None)
def _capsule_functions() -> tuple:
    """Python's functions that read a capsule's address and wrap one in a capsule (torch
    passes tensor handles as capsules)."""
    address, capsule = ctypes.pythonapi.PyCapsule_GetPointer, ctypes.pythonapi.PyCapsule_New
    address.restype, address.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    capsule.restype = ctypes.py_object
    capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return address, capsule


def _drop_constants_image(library: ctypes.CDLL) -> None:
    """The container has copied the program's constants (its weights, packed) out of the
    library's image into memory of its own: the image's pages of them leave memory (read
    from the file again if ever touched), 25-30 MiB a process for the Argos package's steps."""
    try:
        start, end = (ctypes.addressof(ctypes.c_char.in_dll(library, f"_binary_constants_bin_{e}"))
                      for e in ("start", "end"))
    except ValueError:  # no such symbols: constants kept another way
        return
    page = mmap.PAGESIZE
    first, last = -(-start // page) * page, end // page * page
    if last > first and hasattr(mmap, "MADV_DONTNEED"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), mmap.MADV_DONTNEED)


def _check(error: int) -> None:
    if error:
        raise RuntimeError(f"compiled program failed (AOTInductor error {error}); "
                           "its message is in the log above")
