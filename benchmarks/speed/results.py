"""Results of a run as dataclasses; ``to_dict`` / ``from_dict`` give and take the JSON of
``speed.json`` (same keys, same order as ever, so older files still load)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

from aiayn.config import TransformerConfig


def _plain(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class Record:
    """A dataclass that turns into a JSON object and back. Fields named in ``omit_if_none``
    are left out of the JSON while None (keys that only some runs write)."""

    omit_if_none: ClassVar[frozenset[str]] = frozenset()

    def to_dict(self) -> dict:
        out = {}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is None and f.name in self.omit_if_none:
                continue
            out[f.name] = _plain(value)
        return out

    @classmethod
    def from_dict(cls, d: dict):
        names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: v for k, v in d.items() if k in names})


# -- meta ------------------------------------------------------------------------------------
@dataclass(kw_only=True)
class ModelInfo(Record):
    d_model: int
    n_heads: int
    layers: str  # "encoder+decoder"
    d_ff: int
    vocab: int
    parameters: int

    @classmethod
    def of(cls, cfg: TransformerConfig, parameters: int) -> ModelInfo:
        return cls(
            d_model=cfg.d_model,
            n_heads=cfg.n_heads,
            layers=f"{cfg.encoder_layers}+{cfg.decoder_layers}",
            d_ff=cfg.d_ff,
            vocab=cfg.tgt_vocab_size,
            parameters=parameters,
        )


@dataclass(kw_only=True)
class TrainModelInfo(Record):
    """Sizes of the training phase under --train-model base|big."""

    table3: str
    d_model: int
    n_heads: int
    layers: str
    d_ff: int
    dropout: float
    vocab: int
    parameters: int

    @classmethod
    def of(cls, table3: str, cfg: TransformerConfig, parameters: int) -> TrainModelInfo:
        return cls(
            table3=table3,
            d_model=cfg.d_model,
            n_heads=cfg.n_heads,
            layers=f"{cfg.encoder_layers}+{cfg.decoder_layers}",
            d_ff=cfg.d_ff,
            dropout=cfg.dropout,
            vocab=cfg.tgt_vocab_size,
            parameters=parameters,
        )


@dataclass(kw_only=True)
class Meta(Record):
    cpu: str
    threads: int
    device: str
    precision: str | None = None  # "fp32" / "bf16" (None: a file from before --precision)
    cudnn_attention: str | None = None
    gpu: str | None = None
    torch: str
    transformers: str | None
    ctranslate2: str | None
    python: str
    commit: str | None
    quick: bool
    data: str
    checkpoint: str | None
    model: ModelInfo
    train_model: TrainModelInfo | None = None
    wall_s: float | None = None

    omit_if_none = frozenset({"train_model", "wall_s"})

    @classmethod
    def from_dict(cls, d: dict) -> Meta:
        meta = super().from_dict(d)
        meta.model = ModelInfo.from_dict(d["model"])
        if d.get("train_model"):
            meta.train_model = TrainModelInfo.from_dict(d["train_model"])
        return meta


# -- phase 1: training -----------------------------------------------------------------------
@dataclass(kw_only=True)
class TrainSystem(Record):
    parameters: int
    tokens_per_s_median: float
    tokens_per_s_rounds: list[float]
    step_ms_median: float
    ours_over_this: float
    ours_over_this_paired_median: float


@dataclass(kw_only=True)
class TrainProfile(Record):
    file: str
    ranked_by: str
    peers_file: str
    parts_ms_per_step: dict[str, float]
    top_ops: list[dict]  # {"op", "self_ms_per_step", "share"}
    peers_parts_ms_per_step: dict[str, dict[str, float]]


@dataclass(kw_only=True)
class TrainResult(Record):
    protocol: str
    tokens_per_round: list[int]
    systems: dict[str, TrainSystem] = field(default_factory=dict)
    profile: TrainProfile

    @classmethod
    def from_dict(cls, d: dict) -> TrainResult:
        result = super().from_dict(d)
        result.systems = {n: TrainSystem.from_dict(s) for n, s in d["systems"].items()}
        result.profile = TrainProfile.from_dict(d["profile"])
        return result


# -- phase 2: translation --------------------------------------------------------------------
@dataclass(kw_only=True)
class TranslateRow(Record):
    system: str
    decoding: str  # "greedy", "beam 4"
    seconds: float
    sentences_per_s: float
    bleu: float | None
    lengths: str
    decoder_steps: int | None
    ours_over_this: float | None = None  # filled in once ours' row of that decoding exists


@dataclass(kw_only=True)
class TranslateResult(Record):
    protocol: str
    test_set: str
    sentences: int
    batch_size: int
    alpha: float
    trained: bool
    ct2: list[str] | str  # exported kinds, or why there are none
    ct2_dirs: dict[str, str] = field(default_factory=dict)
    ct2_errors: dict[str, str] = field(default_factory=dict)
    rows: list[TranslateRow] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: dict) -> TranslateResult:
        result = super().from_dict(d)
        result.ct2_dirs = result.ct2_dirs or {}
        result.ct2_errors = result.ct2_errors or {}
        result.rows = [TranslateRow.from_dict(r) for r in d["rows"]]
        return result


# -- phase 3: decode cost against output length ----------------------------------------------
@dataclass(kw_only=True)
class GrowthRow(Record):
    length: int
    kv_cache_s: float
    recompute_s: float
    kv_cache_ms_per_step: float
    recompute_ms_per_step: float
    speedup: float


@dataclass(kw_only=True)
class GrowthResult(Record):
    batch: int
    source_length: int
    repeats: int
    protocol: str
    rows: list[GrowthRow] = field(default_factory=list)
    plot: str | None

    @classmethod
    def from_dict(cls, d: dict) -> GrowthResult:
        result = super().from_dict(d)
        result.rows = [GrowthRow.from_dict(r) for r in d["rows"]]
        return result


# -- phase 4: peak memory --------------------------------------------------------------------
@dataclass(kw_only=True)
class MemoryRow(Record):
    """Either ``error`` or the figures (MiB) of one child process."""

    phase: str
    system: str
    error: str | None = None
    baseline_mib: float | None = None
    peak_mib: float | None = None
    cuda_peak_mib: float | None = None
    work_mib: float | None = None

    omit_if_none = frozenset({"error", "baseline_mib", "peak_mib", "cuda_peak_mib", "work_mib"})


@dataclass(kw_only=True)
class MemoryResult(Record):
    method: str
    rows: list[MemoryRow] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: dict) -> MemoryResult:
        result = super().from_dict(d)
        result.rows = [MemoryRow.from_dict(r) for r in d["rows"]]
        return result


# -- the whole run ---------------------------------------------------------------------------
@dataclass(kw_only=True)
class Report(Record):
    """What ``speed.json`` holds: meta, then one entry per phase that ran."""

    meta: Meta
    train: TrainResult | None = None
    translate: TranslateResult | None = None
    growth: GrowthResult | None = None
    memory: MemoryResult | None = None

    omit_if_none = frozenset({"train", "translate", "growth", "memory"})

    @classmethod
    def from_dict(cls, d: dict) -> Report:
        return cls(
            meta=Meta.from_dict(d["meta"]),
            train=TrainResult.from_dict(d["train"]) if "train" in d else None,
            translate=TranslateResult.from_dict(d["translate"]) if "translate" in d else None,
            growth=GrowthResult.from_dict(d["growth"]) if "growth" in d else None,
            memory=MemoryResult.from_dict(d["memory"]) if "memory" in d else None,
        )

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> Report:
        return cls.from_dict(json.loads(path.read_text()))
