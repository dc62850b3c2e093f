"""Phase 1: training throughput of the three peers, interleaved round by round, and where our
step spends its time (torch.profiler)."""

from __future__ import annotations

import statistics
import time

import torch

from .common import LABEL_SMOOTHING, MARIAN, OURS, TORCH_NN, sync
from .context import RunContext
from .data import Setup
from .peers import build_peer, train_step
from .results import TrainProfile, TrainResult, TrainSystem


def bench_train(setup: Setup, ctx: RunContext) -> TrainResult:
    plan, device, out, log = ctx.plan, ctx.device, ctx.out, ctx.log
    names = [OURS, TORCH_NN, MARIAN]
    batches = [b.to(device) for b in setup.batches]
    warm, timed = batches[: plan.warmup_steps], batches[plan.warmup_steps :]
    peers, params = {}, {}
    for name in names:
        peer, opt = build_peer(name, setup.train_cfg or setup.cfg, device)
        peers[name] = (peer, opt)
        params[name] = sum(p.numel() for p in peer.parameters() if p.requires_grad)
        for batch in warm:
            train_step(peer, opt, batch, device, ctx.bf16)
        sync(device)
    rates: dict[str, list[float]] = {n: [] for n in names}
    step_ms: dict[str, list[float]] = {n: [] for n in names}
    k = plan.steps_per_round
    for r in range(plan.rounds):
        chunk = timed[r * k : (r + 1) * k]
        tokens = sum(b.n_tgt_tokens for b in chunk)
        for name in names:  # A, B, C, A, B, C, ...
            peer, opt = peers[name]
            sync(device)
            t0 = time.perf_counter()
            for batch in chunk:
                train_step(peer, opt, batch, device, ctx.bf16)
            sync(device)
            seconds = time.perf_counter() - t0
            rates[name].append(tokens / seconds)
            step_ms[name].append(1000 * seconds / len(chunk))
        log(
            f"train round {r + 1}/{plan.rounds}: "
            + ", ".join(f"{n} {rates[n][-1]:.0f} tok/s" for n in names)
        )

    # Where each step spends its time (ours in detail, the peers for comparison).
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    sort = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    profiles = {}
    for name in names:
        peer, opt = peers[name]
        label = "ours" if name == OURS else "peer"
        with torch.profiler.profile(activities=activities) as prof:
            for batch in timed[: plan.profile_steps]:
                train_step(peer, opt, batch, device, ctx.bf16, label=label)
            sync(device)
        profiles[name] = prof.key_averages()
    header = f"{plan.profile_steps} training step(s), torch.profiler, sorted by {sort}"

    def table(n: str) -> str:
        body = profiles[n].table(sort_by=sort, row_limit=30, max_name_column_width=60)
        return f"{n}: {header}\n\n{body}\n"

    (out / "profile_train_ours.txt").write_text(table(OURS))
    (out / "profile_train_peers.txt").write_text("\n".join(table(n) for n in names[1:]))
    averages = profiles[OURS]
    ops = [e for e in averages if not e.key.startswith(("ours/", "ProfilerStep"))]
    total_self = sum(getattr(e, sort) for e in ops) or 1.0
    top_ops = [
        {
            "op": e.key,
            "self_ms_per_step": round(getattr(e, sort) / 1000 / plan.profile_steps, 2),
            "share": round(getattr(e, sort) / total_self, 3),
        }
        for e in sorted(ops, key=lambda e: getattr(e, sort), reverse=True)[:10]
    ]

    def parts_of(averages, label: str) -> dict[str, float]:
        return {
            e.key.split("/", 1)[1]: round(e.cpu_time_total / 1000 / plan.profile_steps, 1)
            for e in averages
            if e.key.startswith(f"{label}/")
        }

    parts = parts_of(averages, "ours")
    peer_parts = {n: parts_of(profiles[n], "peer") for n in names if n != OURS}
    del peers

    med = {n: statistics.median(rates[n]) for n in names}
    result = TrainResult(
        protocol=(
            f"{plan.warmup_steps} warm-up step(s) per system, then {plan.rounds} interleaved "
            f"rounds of {k} timed step(s) on the same batches (max_tokens {plan.max_tokens}); "
            "step = forward, projection of real target positions, label-smoothed CE "
            f"{LABEL_SMOOTHING}, backward, Adam"
        ),
        tokens_per_round=[
            sum(b.n_tgt_tokens for b in timed[r * k : (r + 1) * k]) for r in range(plan.rounds)
        ],
        profile=TrainProfile(
            file="profile_train_ours.txt",
            ranked_by=sort,
            peers_file="profile_train_peers.txt",
            parts_ms_per_step=parts,
            top_ops=top_ops,
            peers_parts_ms_per_step=peer_parts,
        ),
    )
    for n in names:
        paired = [a / b for a, b in zip(rates[OURS], rates[n])]
        result.systems[n] = TrainSystem(
            parameters=params[n],
            tokens_per_s_median=round(med[n], 1),
            tokens_per_s_rounds=[round(x, 1) for x in rates[n]],
            step_ms_median=round(statistics.median(step_ms[n]), 1),
            ours_over_this=round(med[OURS] / med[n], 3),
            ours_over_this_paired_median=round(statistics.median(paired), 3),
        )
    return result
