"""Several processes on torch.distributed, as ``torchrun`` starts them.

torchrun gives every process RANK, WORLD_SIZE and LOCAL_RANK in its environment; a plain
``aiayn ...`` run has none and is a world of one, where nothing here talks to anything.
Backends: NCCL between GPUs, gloo on CPUs.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from aiayn.errors import AiaynError, CollectiveError


def exit_if_bootstrapping(message: str) -> None:
    """Exit with ``message`` in a process that multiprocessing started (spawn, fork server)
    while it still imports the main module: that process imports the script which started
    it, and a script without an ``if __name__ == "__main__":`` guard would do its work
    again from inside it (load a model, start a server or more processes), which fails or
    waits forever. ``message`` says to add the guard."""
    import multiprocessing as mp
    import sys

    if getattr(mp.current_process(), "_inheriting", False):  # set while it imports main
        print(message, file=sys.stderr, flush=True)  # a fork server's child drops SystemExit's
        raise SystemExit(1)


# How long a rank waits in a collective (or at start-up, for the others to join) before
# the job fails. Long enough for rank 0 to prepare raw text while the others wait; a
# recipe sets its own (``collective_timeout_minutes``).
COLLECTIVE_TIMEOUT_MINUTES = 30.0


@contextlib.contextmanager
def collective_failures() -> Iterator[None]:
    """Runs the block (or, as a decorator, the function); a failure of the communication
    between processes inside it (a peer that died, a collective that timed out, as gloo,
    NCCL or DDP raise it) becomes a :class:`CollectiveError` of one line: a job whose
    rank is killed then ends with the survivors saying so, not with a traceback from deep
    inside torch on each. Any other error passes unchanged (a bug keeps its traceback)."""
    try:
        yield
    except RuntimeError as e:
        first = str(e).strip().split("\n", 1)[0]
        if not (isinstance(e, dist.DistError) or re.search(r"\bgloo/", first)):
            raise
        # gloo's "[path/pair.cc:553] Connection closed by peer [addr]. This is typically
        # caused by ..." -> "Connection closed by peer [addr]"
        detail = re.sub(r"^\[[^\]]*\]\s*", "", first).split(". ", 1)[0]
        raise CollectiveError(
            f"another process of the job failed or stopped, or waited past the collective "
            f"timeout ({detail}); the log of each process says which and why"
        ) from None


@dataclass(frozen=True)
class World:
    """This process's place among the processes of one job."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0  # rank among the processes of this machine: which GPU to use

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that prints, writes files and saves checkpoints."""
        return self.rank == 0

    def shard(self, n: int) -> range:
        """This rank's contiguous share of ``n`` items; shares differ in size by at most
        one, and rank order is item order (so gathering them restores the order)."""
        base, extra = divmod(n, self.size)
        start = self.rank * base + min(self.rank, extra)
        return range(start, start + base + (self.rank < extra))

    @collective_failures()
    def gather(self, items: list[Any]) -> list[Any] | None:
        """Every rank's ``items`` (picklable), concatenated in rank order, on rank 0;
        None on the other ranks."""
        if self.size == 1:
            return list(items)
        if not self.is_main:
            dist.gather_object(items, None, dst=0)
            return None
        parts: list[Any] = [None] * self.size
        dist.gather_object(items, parts, dst=0)
        return [item for part in parts for item in part]

    @collective_failures()
    def sum(self, values: list[float]) -> list[float]:
        """``values`` summed element-wise over all ranks (float64), on every rank."""
        if self.size == 1:
            return [float(v) for v in values]
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        tensor = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(tensor)
        return tensor.tolist()

    @collective_failures()
    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` (picklable), on every rank."""
        if self.size == 1:
            return obj
        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    @collective_failures()
    def barrier(self) -> None:
        """Wait until every rank got here (a fence after rank 0 wrote a file)."""
        if self.size > 1:
            dist.barrier()

    def device(self, name: str) -> str:
        """``cuda`` becomes this process's own GPU, ``cuda:<local_rank>``."""
        return f"cuda:{self.local_rank}" if name == "cuda" and self.size > 1 else name


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise AiaynError(f"environment variable {name}={value!r} is not a number") from None


def _env_text(name: str) -> str:
    return f"environment variable {name}={os.environ[name]!r}"


def world_from_env() -> World:
    """This process's :class:`World` as RANK, WORLD_SIZE and LOCAL_RANK describe it (a
    world of one when none is set), checked before anything joins a group: a rank outside
    the world would wait forever for peers that never come, and a world of one with a
    nonzero rank would leave this process with no share of the work.

    Raises AiaynError naming the variable and its value when they do not describe a
    world torchrun could start."""
    size = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", 0)
    if size < 1:
        raise AiaynError(f"{_env_text('WORLD_SIZE')} must be at least 1")
    if "RANK" in os.environ and "WORLD_SIZE" not in os.environ:
        raise AiaynError(f"{_env_text('RANK')} is set but WORLD_SIZE is not")
    if size > 1 and "RANK" not in os.environ:
        raise AiaynError(f"{_env_text('WORLD_SIZE')} is set but RANK is not")
    if not 0 <= rank < size:
        raise AiaynError(f"{_env_text('RANK')} must be in [0, WORLD_SIZE={size})")
    local_size = _env_int("LOCAL_WORLD_SIZE", size)
    if not 1 <= local_size <= size:
        raise AiaynError(f"{_env_text('LOCAL_WORLD_SIZE')} must be in [1, WORLD_SIZE={size}]")
    if not 0 <= local_rank < local_size:
        raise AiaynError(f"{_env_text('LOCAL_RANK')} must be in [0, {local_size})")
    if size > 1:
        for name in ("MASTER_ADDR", "MASTER_PORT"):
            if not os.environ.get(name):
                raise AiaynError(
                    f"environment variable {name} is not set (WORLD_SIZE={size} needs "
                    "MASTER_ADDR and MASTER_PORT, as torchrun sets them)"
                )
        port = _env_int("MASTER_PORT", 0)
        if not 0 < port < 65536:
            raise AiaynError(f"{_env_text('MASTER_PORT')} must be a port in [1, 65535]")
    return World(rank, size, local_rank)


def init_from_env(
    device: str = "cpu", timeout_minutes: float = COLLECTIVE_TIMEOUT_MINUTES
) -> World:
    """Join the process group that torchrun's environment describes (gloo on the CPU, NCCL
    for ``cuda``); a world of one when there is none. Safe to call twice (the first call's
    timeout holds). A collective that waits longer than ``timeout_minutes`` for another
    rank raises, instead of hanging the job (torch's default is 30 min for gloo, 10 for
    NCCL: here it is explicit)."""
    if not (timeout_minutes > 0 and math.isfinite(timeout_minutes)):
        raise AiaynError(f"the collective timeout must be > 0 minutes, got {timeout_minutes}")
    world = world_from_env()
    if world.size > 1 and not dist.is_initialized():
        backend = "nccl" if device.startswith("cuda") else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(world.local_rank)
        timeout = timedelta(minutes=timeout_minutes)
        with collective_failures():  # the others never joined: one line, not DistStoreError's
            store = _attempt_store(world, timeout)
            if store is None:
                dist.init_process_group(backend=backend, timeout=timeout)
            else:
                dist.init_process_group(
                    backend, store=store, rank=world.rank, world_size=world.size, timeout=timeout
                )
        # A process that exits with the group still alive can abort in gloo's teardown
        # ("terminate called without an active exception"): its worker threads are then
        # destroyed during interpreter finalization, or a peer still talks to it. Leaving
        # at exit, while Python is still whole, covers every caller (the CLI leaves earlier
        # itself; a no-op then): after the ranks meet, unless an uncaught exception ends
        # this one (its peers may wait for it in a collective: leave at once).
        atexit.register(lambda: shutdown(synchronize=getattr(sys, "last_value", None) is None))
    return world


def _attempt_store(world: World, timeout: timedelta) -> dist.Store | None:
    """Under torchrun, the rendezvous store seen through a prefix of its own for this
    restart (TORCHELASTIC_RESTART_COUNT); None elsewhere (plain env:// set-up).

    torchrun keeps one store across the restarts of ``--max-restarts``: without the prefix
    the workers of a restarted group can read the addresses that the previous (killed)
    group left under the same keys, and gloo then fails with "Connection refused"."""
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if restart is None or "MASTER_ADDR" not in os.environ:
        return None
    agent_hosts_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        _env_int("MASTER_PORT", 29500),
        world.size,
        is_master=not agent_hosts_store and world.rank == 0,
        timeout=timeout,
        multi_tenant=not agent_hosts_store,
    )
    return dist.PrefixStore(f"aiayn/attempt{restart}/", store)


# How long a finished rank waits for the others before leaving the process group.
LEAVE_TIMEOUT_SECONDS = 120.0


def shutdown(synchronize: bool = False) -> None:
    """Leave the process group, if this process joined one.

    With ``synchronize`` (the command ended normally) the ranks first wait for each other,
    so that none tears down its connections while a peer may still be using them (gloo
    can then abort a process at exit). A peer that does not arrive within
    ``LEAVE_TIMEOUT_SECONDS`` (it failed, and says so itself) is not waited for.
    """
    if not dist.is_initialized():
        return
    if synchronize:
        try:
            if dist.get_backend() == "gloo":  # the barrier that can time out
                dist.monitored_barrier(timeout=timedelta(seconds=LEAVE_TIMEOUT_SECONDS))
            else:
                dist.barrier()
        except RuntimeError:
            pass  # a peer failed or left: leaving is all that is left to do
    dist.destroy_process_group()
