"""torchrun: one translation worker per process (torch.distributed), rank 0 writing the output.

Every rank reads and batches the whole input as one process does; each decodes a contiguous
block of every shard's batches, and rank 0 gathers the blocks in batch order, so the output is
the one-process output, byte for byte. gloo connects CPU workers, nccl GPU workers.
torch.distributed is imported where it is used: the command line reads the rank before torch.
"""
import os
from typing import List, Optional, Tuple


def world() -> Tuple[int, int]:
    """(rank, number of workers) as torchrun sets them, else (0, 1)."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def join(gpu: bool) -> None:
    """Joins the process group torchrun describes (once)."""
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group("nccl" if gpu else "gloo")


def block(count: int, rank: int, size: int) -> range:
    """Rank ``rank``'s contiguous share of ``count`` batches (a share may be empty)."""
    return range(count * rank // size, count * (rank + 1) // size)


def gather(results: list, rank: int, size: int) -> Optional[List]:
    """Every rank's results, in rank order, on rank 0 (None elsewhere)."""
    import torch.distributed as dist
    parts = [None] * size if rank == 0 else None
    dist.gather_object(results, parts, dst=0)
    return [item for part in parts for item in part] if rank == 0 else None


def leave() -> None:
    """Waits for every rank, then leaves the group: a rank that exits while another still
    talks to it over gloo makes that one abort (SIGABRT) instead of ending cleanly."""
    import torch.distributed as dist
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def barrier() -> None:
    """Waits for every rank."""
    import torch.distributed as dist
    dist.barrier()
