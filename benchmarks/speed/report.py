"""The Markdown tables of a run (OUT/speed.md, ready for BENCHMARKS.md), built from its
results; ``python -m benchmarks.speed report --out OUT`` rebuilds them from OUT/speed.json
without running anything."""

from __future__ import annotations

from pathlib import Path

from .results import Report


def fmt(x, digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:,.{digits}f}"


def markdown(report: Report) -> str:
    """speed.md: a header on the machine and model, then one section per phase that ran."""
    lines = _header(report)
    if report.train is not None:
        lines += _train_section(report)
    if report.translate is not None:
        lines += _translate_section(report)
    if report.growth is not None:
        lines += _growth_section(report)
    if report.memory is not None:
        lines += _memory_section(report)
    return "\n".join(lines)


def _header(report: Report) -> list[str]:
    m = report.meta
    lines = [
        "## Speed against peers (`python -m benchmarks.speed`)",
        "",
        f"{m.cpu}, {m.threads} thread(s), device {m.device}"
        + (f" ({m.gpu})" if m.gpu else "")
        + (
            f", cuDNN attention {m.cudnn_attention} (ours never uses it)"
            if m.device == "cuda"
            else ""
        )
        + f"; torch {m.torch}, "
        f"transformers {m.transformers}, ctranslate2 {m.ctranslate2 or 'not installed'}. "
        f"Model: d_model {m.model.d_model}, {m.model.n_heads} heads, "
        f"{m.model.layers} layers, d_ff {m.model.d_ff}, "
        f"vocabulary {m.model.vocab} ({m.model.parameters / 1e6:.1f}M parameters). "
        f"Data: {m.data}."
        + (" **Quick (smoke) run: tiny sizes, not for BENCHMARKS.md.**" if m.quick else ""),
        "",
    ]
    return lines


def _train_section(report: Report) -> list[str]:
    """Training throughput and our step profile."""
    m = report.meta
    t = report.train
    tm = m.train_model
    sizes = (
        f" Model for this phase: Table 3 {tm.table3} (d_model {tm.d_model}, "
        f"{tm.n_heads} heads, {tm.layers} layers, d_ff {tm.d_ff}, dropout "
        f"{tm.dropout}, vocabulary {tm.vocab}, {tm.parameters / 1e6:.1f}M)."
        if tm
        else ""
    )
    precision = " bf16 autocast, every system." if m.precision == "bf16" else ""
    lines = [
        "### Training throughput",
        "",
        f"{t.protocol}. Median over rounds.{precision}{sizes}",
        "",
        "| system | parameters | target tokens/s | ms/step | ours / system (paired) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, s in t.systems.items():
        lines.append(
            f"| {name} | {s.parameters / 1e6:.2f}M | {fmt(s.tokens_per_s_median, 0)} | "
            f"{fmt(s.step_ms_median)} | {s.ours_over_this:.2f}x "
            f"({s.ours_over_this_paired_median:.2f}x) |"
        )
    p = t.profile
    parts = ", ".join(f"{k} {v:.0f} ms" for k, v in p.parts_ms_per_step.items())
    top = ", ".join(f"`{o['op']}` {100 * o['share']:.0f}%" for o in p.top_ops[:6])
    lines += [
        "",
        f"Our step ({p.file}): {parts}. Top ops by self CPU time: {top}.",
        "",
    ]
    return lines


def _translate_section(report: Report) -> list[str]:
    """Translation speed and BLEU per system and decoding."""
    m = report.meta
    t = report.translate
    lines = [
        f"### Translation of {t.test_set} ({t.sentences} sentences, batch {t.batch_size}"
        + (", bf16 weights for ours and Marian)" if m.precision == "bf16" else ")"),
        "",
        "| system | decoding | sentences/s | ours / system | BLEU | output lengths |",
        "|---|---|---:|---:|---:|---|",
    ]
    for r in t.rows:
        lines.append(
            f"| {r.system} | {r.decoding} | {fmt(r.sentences_per_s)} | "
            f"{r.ours_over_this:.2f}x | {fmt(r.bleu, 2)} | {r.lengths} |"
        )
    notes = [
        f"{t.protocol[0].upper()}{t.protocol[1:]}.",
        "Marian has random weights (no hub download), so its BLEU is meaningless; to make the "
        "speed comparison fair it decodes the very same batches (sorted by length, "
        f"{t.batch_size} each) with `min_new_tokens = max_new_tokens` = the number of "
        "decoder steps our model ran on that batch, so both run the same number of steps "
        "(Marian keeps finished rows in the batch, ours drops them).",
    ]
    if not t.trained:
        notes.append(
            "No --checkpoint: our model is untrained too, so BLEU is not meaningful "
            "(speed only); outputs mostly run to source length + 50."
        )
    if isinstance(t.ct2, str):
        notes.append(f"CTranslate2 rows skipped: {t.ct2}.")
    else:
        notes.append(
            "CTranslate2 runs our exported weights with its own length penalty "
            f"(length^{t.alpha}, ours GNMT's ((5+|Y|)/6)^{t.alpha})."
        )
    for name, error in t.ct2_errors.items():
        notes.append(f"CTranslate2 {name} could not run here: {error}")
    lines += ["", *notes, ""]
    return lines


def _growth_section(report: Report) -> list[str]:
    """Decode cost against output length, with and without the cache."""
    g = report.growth
    lines = [
        f"### Decode cost against output length (ours, batch {g.batch})",
        "",
        f"{g.protocol}." + (f" Plot: `{g.plot}`." if g.plot else ""),
        "",
        "| L | KV cache s | recompute s | KV ms/step | recompute ms/step | speed-up |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in g.rows:
        lines.append(
            f"| {r.length} | {r.kv_cache_s:.3f} | {r.recompute_s:.3f} | "
            f"{r.kv_cache_ms_per_step:.2f} | {r.recompute_ms_per_step:.2f} | "
            f"{r.speedup:.1f}x |"
        )
    lines.append("")
    return lines


def _memory_section(report: Report) -> list[str]:
    """Peak memory per phase and system."""
    mem = report.memory
    lines = [
        "### Peak memory",
        "",
        f"{mem.method}.",
        "",
        "| phase | system | peak RSS MiB | over baseline MiB |",
        "|---|---|---:|---:|",
    ]
    for r in mem.rows:
        if r.error is not None:
            lines.append(f"| {r.phase} | {r.system} | error: {r.error} | |")
        else:
            extra = f" (GPU {r.cuda_peak_mib:.0f})" if r.cuda_peak_mib is not None else ""
            lines.append(f"| {r.phase} | {r.system} | {r.peak_mib:.0f}{extra} | {r.work_mib:.0f} |")
    lines.append("")
    return lines


def write(report: Report, out: Path) -> None:
    """OUT/speed.json and OUT/speed.md of a finished run."""
    report.save(out / "speed.json")
    (out / "speed.md").write_text(markdown(report))


def regenerate(out: Path) -> Path:
    """OUT/speed.md rebuilt from OUT/speed.json (nothing is run); returns its path."""
    path = out / "speed.md"
    path.write_text(markdown(Report.load(out / "speed.json")))
    return path
