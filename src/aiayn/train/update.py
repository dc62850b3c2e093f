"""One optimizer update (Section 5.3), on one process or data-parallel on several.

An update covers a *group* of micro-batches from the epoch's global batch plan. On W
processes (``torchrun``) each rank runs its share of the group, padded with zero-weight
copies so every rank runs the same number of forward/backward passes (fairseq's dummy
batches): no collective ever waits on a rank that ran out. The loss is divided by the
group's target tokens, all-reduced, so an update on W ranks equals one process running the
union of their micro-batches.

Pieces: :class:`TrainingLoss`, the module one step differentiates (what torch.compile and
DistributedDataParallel wrap), and :class:`Updater`, which runs the micro-batches with
``no_sync`` on all but the last, the autocast precision, the fp16 loss scale, gradient
clipping and the guard that skips updates whose loss or gradient is not finite.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast, overload

import torch
from torch import Tensor, nn

from aiayn.data.batching import BUCKETS, Batch
from aiayn.distributed import World, collective_failures
from aiayn.errors import RecipeError, TrainingError
from aiayn.model.transformer import Transformer
from aiayn.train.loss import (
    label_smoothed_cross_entropy,
    projected_label_smoothed_loss,
    token_losses,
)
from aiayn.train.schedule import NoamSchedule

T = TypeVar("T")
PRECISIONS = ("fp32", "bf16", "fp16")
# What torch.compile lowers the step with. Tests and the CPU smoke check of
# benchmarks/gpu_check.py set "eager" (dynamo's graphs, run as they are: no C++ compiler).
COMPILE_BACKEND = "inductor"
# The fused loss of a compiled step cuts its B x T positions into this many pieces: a
# count fixed whatever the shape, which is dynamic.
COMPILE_LOSS_CHUNKS = 8


class TrainingLoss(nn.Module):
    """``(src [B, S], tgt_in [B, T], tgt_out [B, T]) -> [2]``: the label-smoothed loss and
    the NLL, each summed over the real (non-pad) target positions, in float32.

    The output projection is fused into the loss (:func:`projected_label_smoothed_loss`):
    the ``[positions x V]`` logits are formed a chunk at a time, never whole. Eager steps
    keep only the real positions first, to save the pads' share of the projection;
    ``static_shapes=True`` (for torch.compile) projects every position and masks the pads
    instead, cut into :data:`COMPILE_LOSS_CHUNKS` pieces: selecting positions gives
    data-dependent shapes, which break a compiled graph. Both give the same sums."""

    def __init__(self, model: Transformer, epsilon: float, static_shapes: bool = False):
        super().__init__()
        self.model, self.epsilon, self.static_shapes = model, epsilon, static_shapes

    def forward(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> Tensor:
        pad_id, model = self.model.cfg.pad_id, self.model
        hidden = model(src, tgt_in, project=False)  # [B, T, d_model]
        weight, bias = _projection(model)
        if weight is None:  # a projection module of its own kind (int8): logits, then loss
            if not self.static_shapes:
                keep = tgt_out != pad_id
                logits = model.project(hidden[keep])  # [N, V]
                target = tgt_out[keep]
                loss, nll, _ = label_smoothed_cross_entropy(logits, target, self.epsilon, pad_id)
                return torch.stack([loss, nll])
            loss, nll = token_losses(model.project(hidden), tgt_out, self.epsilon)  # [B, T]
            keep = (tgt_out != pad_id).float()
            return torch.stack([(loss * keep).sum(), (nll * keep).sum()])
        if self.static_shapes:
            chunks: int | None = COMPILE_LOSS_CHUNKS
        else:
            keep = tgt_out != pad_id
            hidden, tgt_out, chunks = hidden[keep][None], tgt_out[keep][None], None  # [1, N]
        loss, nll = projected_label_smoothed_loss(
            hidden, weight, bias, tgt_out, self.epsilon, pad_id, chunks
        )
        return torch.stack([loss, nll])


def _projection(model: Transformer) -> tuple[Tensor | None, Tensor | None]:
    """The output projection's ``(weight [V, d_model], bias [V] or None)``, or (None, None)
    when it is a module other than a plain bias-free Linear (int8 quantization)."""
    proj: nn.Module | None = model.out_proj  # quantization may swap in another module
    if proj is None:
        return model.tgt_embed.weight, model.out_bias
    if type(proj) is nn.Linear and getattr(proj, "bias", None) is None:
        return proj.weight, model.out_bias
    return None, None


@dataclass
class UpdateResult:
    loss: float  # per target token, over the whole group (all ranks)
    nll: float
    n_tokens: int  # real target tokens of the group (all ranks)
    grad_norm: float  # before clipping; inf or nan when the update was skipped
    skipped: bool  # the loss or the gradient was not finite: parameters left unchanged


def rank_share(group: Sequence[Any], world: World) -> list[tuple[int, float]]:
    """This rank's micro-batches of ``group`` as (index into group, weight): every W-th
    one from the rank's own offset, then zero-weight repeats of the group's first so every
    rank runs ``ceil(len(group) / W)`` of them."""
    n_micro = math.ceil(len(group) / world.size)
    own = [(i, 1.0) for i in range(world.rank, len(group), world.size)]
    return own + [(0, 0.0)] * (n_micro - len(own))


class Updater:
    """Runs updates of ``model`` with ``optimizer`` and ``schedule``, on ``world``.

    ``compile=True`` runs the step through ``torch.compile`` (before the DDP wrap, as
    recommended). A batch is then padded to one of a few lengths, both sides alike
    (:meth:`Batch.padded_to_bucket`), and its row count and length are marked dynamic: the
    step compiles one graph whatever the batches, not one per length bucket (a minute or
    more each on a GPU)."""

    def __init__(
        self,
        model: Transformer,
        optimizer: torch.optim.Optimizer,
        schedule: NoamSchedule,
        world: World,
        *,
        label_smoothing: float = 0.1,
        clip_norm: float = 0.0,
        precision: str = "fp32",
        compile: bool = False,
    ):
        if precision not in PRECISIONS:
            choices = ", ".join(PRECISIONS)
            raise RecipeError(f"precision must be one of {choices}, got {precision!r}")
        self.model, self.optimizer, self.schedule, self.world = model, optimizer, schedule, world
        self.device = next(model.parameters()).device
        self.clip_norm, self.precision, self.compiled = clip_norm, precision, compile
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        # fp16's range is narrow: a dynamic loss scale keeps small gradients from flushing
        # to zero, and halves itself (skipping that update) when one overflows.
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=precision == "fp16")
        step: nn.Module = TrainingLoss(model, label_smoothing, static_shapes=compile)
        if compile:  # an OptimizedModule, a Module (typed as a mere callable)
            # Should a length be specialised after all (a shape guard), one graph per
            # bucket: up to 15, beyond dynamo's default limit of 8, past which it would
            # run the rest eagerly.
            limit = torch._dynamo.config.recompile_limit
            torch._dynamo.config.recompile_limit = max(limit, len(BUCKETS) + 2)
            step = cast(nn.Module, torch.compile(step, dynamic=False, backend=COMPILE_BACKEND))
        if world.size > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            # The positional table is a constant buffer: nothing to broadcast each step.
            with collective_failures():  # it broadcasts rank 0's weights
                step = nn.parallel.DistributedDataParallel(
                    step, device_ids=ids, forward_sync_buffers=False
                )
        self.step_module = step
        # The process may have compiled other graphs before (other runs, other models).
        self.graphs_before = compiled_graphs() if compile else 0

    def compile_note(self) -> str:
        """ "; torch.compile: N graphs" (made for this updater's step so far, a new shape's
        too) for a compiled step, else ""."""
        if not self.compiled:
            return ""
        return f"; torch.compile: {compiled_graphs() - self.graphs_before} graphs"

    def _forward_backward(self, batch: Batch, scale: float) -> Tensor:
        if self.compiled:
            batch = batch.padded_to_bucket(self.model.cfg.max_len)
        batch = batch.to(self.device)
        if self.compiled:  # one graph for any rows and length: dynamic=False leaves these
            for ids in (batch.src, batch.tgt_in, batch.tgt_out):
                torch._dynamo.maybe_mark_dynamic(ids, 0)
                torch._dynamo.maybe_mark_dynamic(ids, 1)
        autocast = torch.autocast(self.device.type, self.dtype, enabled=self.dtype is not None)
        with _compile_failures():  # the backward pass compiles at its first call too
            with autocast:  # the forward pass alone, as torch advises
                sums = self.step_module(batch.src, batch.tgt_in, batch.tgt_out)  # [2]
            self.scaler.scale(sums[0] * scale).backward()
        return sums.detach()

    @overload
    def update(self, group: Sequence[Batch]) -> UpdateResult: ...
    @overload
    def update(self, group: Sequence[T], load: Callable[[T], Batch]) -> UpdateResult: ...
    @collective_failures()  # DDP's all-reduce of the gradients: a dead peer, one line
    def update(
        self, group: Sequence[Any], load: Callable[[Any], Batch] = lambda batch: batch
    ) -> UpdateResult:
        """One update over ``group`` (the whole group, as every rank sees it; each rank runs
        its share, and ``load``s only its share: e.g. index arrays read into batches).
        Parameters change only when the loss and gradient are finite."""
        world = self.world
        plan = rank_share(group, world)
        loaded = {i: load(group[i]) for i in dict.fromkeys(i for i, _ in plan)}  # once each
        share = [(loaded[i], weight) for i, weight in plan]
        n_tokens = int(world.sum([sum(b.n_tgt_tokens for b, w in share if w)])[0])
        if not n_tokens:  # every rank sees the sum: all raise alike
            raise TrainingError(f"update: a group of {len(group)} batch(es) with no target token")
        self.optimizer.zero_grad(set_to_none=True)
        sums = torch.zeros(2, device=self.device)
        step = self.step_module
        ddp = step if isinstance(step, nn.parallel.DistributedDataParallel) else None  # W > 1
        for k, (batch, weight) in enumerate(share):
            # DDP averages gradients over ranks: W / n_tokens makes that average the
            # gradient of the group's per-token mean. no_sync skips the all-reduce on all
            # but the last micro-batch; it must enclose the forward pass too, not only
            # the backward, or DDP would still reduce.
            last = k == len(share) - 1
            with ddp.no_sync() if ddp is not None and not last else contextlib.nullcontext():
                sums += weight * self._forward_backward(batch, weight * world.size / n_tokens)
        self.scaler.unscale_(self.optimizer)
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.clip_norm > 0:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, self.clip_norm))
        else:  # the norm only, for the guard below
            grads = [p.grad for p in params if p.grad is not None]
            grad_norm = float(torch.nn.utils.get_total_norm(grads))
        loss_sum, nll_sum = world.sum(sums.tolist())
        skipped = not (math.isfinite(loss_sum) and math.isfinite(grad_norm))
        if skipped:
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.scaler.step(self.optimizer)
            self.schedule.step()
        self.scaler.update()  # fp16: halves the scale after an overflow, grows it later
        return UpdateResult(loss_sum / n_tokens, nll_sum / n_tokens, n_tokens, grad_norm, skipped)


@contextlib.contextmanager
def whole() -> Iterator[None]:
    """A first Ctrl-C (SIGINT) during the block is raised as KeyboardInterrupt once it
    ends, so that an update and its bookkeeping are done whole or not at all: ``train()``
    called again then goes on as an uninterrupted run would (the weights, Adam's moments
    and the dropout stream of a half-done update cannot be taken back). A second Ctrl-C
    raises at once; the first says so on stderr (an update may take minutes: the first
    of a compiled step). Only in the main thread, where Python's handler is set."""
    main = threading.current_thread() is threading.main_thread()
    if not main or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    caught: list[int] = []

    def defer(signum: int, _frame: object) -> None:
        caught.append(signum)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second one: at once
        with contextlib.suppress(OSError):  # unbuffered: a print could re-enter one
            os.write(2, b"\nstopping once this update is done (Ctrl-C again: at once)\n")

    signal.signal(signal.SIGINT, defer)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if caught:
        raise KeyboardInterrupt


def compiled_graphs() -> int:
    """Graphs torch.compile has compiled in this process (first compilations and
    recompilations for new shapes alike)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


@contextlib.contextmanager
def _compile_failures() -> Iterator[None]:
    """A compiled step that torch cannot build (no C++ compiler, say) is one line naming
    the cause and the way around it, not torch's 170 lines of traceback."""
    try:
        yield
    except torch._dynamo.exc.BackendCompilerFailed as e:
        inner = e.inner_exception
        cause = f"{type(inner).__name__}: {(str(inner).strip().splitlines() or [''])[0]}"
        raise TrainingError(
            f"torch.compile could not build the training step ({cause}); the recipe's "
            "compile: false trains without it"
        ) from None
