"""What every search shares (Section 6.1): one inference context, one length rule, one
banned-token set, forced prefixes, and one incremental decode step that drops finished rows
(over one model, or an ensemble that averages several models' probabilities).

Like fairseq's and OpenNMT-py's generators, the searches feed the decoder one token per
step through a key/value cache (:class:`~aiayn.model.transformer.DecoderState`), so step t
costs O(t) attention instead of recomputing the whole output so far.
"""

from __future__ import annotations

import math
import operator
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from aiayn.config import TransformerConfig
from aiayn.decode.options import DecodeOptions
from aiayn.errors import DecodeError
from aiayn.model.transformer import DecoderState, Transformer

# What the searches decode with: one model, or several whose probabilities are averaged.
Models = Transformer | Sequence[Transformer]


def as_list(models: Models) -> list[Transformer]:
    """``models`` as a non-empty list; DecodeError unless the models can be ensembled (one
    target vocabulary and the same special ids, so their distributions line up)."""
    found = [models] if isinstance(models, Transformer) else list(models or [])
    if not found:
        raise DecodeError("no model to decode with")
    for i, model in enumerate(found, start=1):
        if not isinstance(model, Transformer):
            raise DecodeError(f"model {i} is a {type(model).__name__}, not a Transformer")
        if any(t.is_meta for t in [*model.parameters(), *model.buffers()]):  # or a part
            raise DecodeError(f"model {i} is on the meta device, which holds no weights")
    first = found[0].cfg
    for i, other in enumerate(found[1:], start=2):
        for name in ("tgt_vocab_size", "pad_id", "bos_id", "eos_id"):
            if getattr(other.cfg, name) != getattr(first, name):
                raise DecodeError(
                    f"ensemble: model {i} has {name}={getattr(other.cfg, name)} but model 1 "
                    f"has {getattr(first, name)}; ensembled models need one target vocabulary"
                )
    return found


@contextmanager
def inference(models: Models) -> Iterator[None]:
    """Eval mode (no dropout) and no autograd for the block, for one model or several:
    every module in training mode is switched (a model in eval mode may hold a part in
    training mode: a decoder fine-tuned alone) and switched back when the last block open
    on the model ends, in any thread, even if decoding raises. Within another block on the
    same model (a search's steps, or a second thread's) it walks no module, which costs
    more than a small model's decoding step, unless the model was put in training mode."""
    found = [models] if isinstance(models, Transformer) else list(models)
    with _lock:
        for model in found:
            count, switched = _open.get(id(model), (0, []))
            if not count or model.training:  # a model.train() since: switch that too
                switched = switched + [m for m in model.modules() if m.training]
                for module in switched:
                    module.training = False
            _open[id(model)] = (count + 1, switched)
    try:
        if torch.is_inference_mode_enabled():
            yield
        else:
            with torch.inference_mode():
                yield
    finally:
        with _lock:
            for model in found:
                count, switched = _open.pop(id(model))
                if count > 1:
                    _open[id(model)] = (count - 1, switched)
                for module in switched if count == 1 else ():
                    module.training = True


# Per model (by id, alive while its blocks are open): inference() blocks open on it, and
# the modules the first of them switched to eval mode.
_open: dict[int, tuple[int, list[nn.Module]]] = {}
_lock = threading.Lock()


def check_src(src: object) -> None:
    """DecodeError unless ``src`` is a ``[batch, length]`` tensor (of token ids: the
    model checks their values)."""
    if not isinstance(src, Tensor) or src.dim() != 2:
        got = f"a {src.dim()}-D tensor" if isinstance(src, Tensor) else type(src).__name__
        raise DecodeError(f"src must be a [batch, length] tensor of token ids, got {got}")
    if src.is_meta:
        raise DecodeError("src is on the meta device, which holds no ids")


def length_limits(
    cfg: TransformerConfig,
    src: Tensor,
    max_new_tokens: int | None = None,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
) -> Tensor:
    """The most tokens (EOS included) each sentence of ``src [B, S]`` may produce: ``[B]``.

    ``max_len_a * src_len + max_len_b`` (fairseq's rule; src_len counts real tokens, not
    padding), capped by ``max_new_tokens`` when given and always by the model's ``max_len``
    positions.
    """
    if max_new_tokens is not None and max_new_tokens < 0:
        raise DecodeError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if not (math.isfinite(max_len_a) and max_len_a >= 0 and max_len_b >= 0):
        raise DecodeError(f"need max_len_a >= 0 and max_len_b >= 0, got {max_len_a}, {max_len_b}")
    src_len = (src != cfg.pad_id).sum(dim=1)
    cap = cfg.max_len if max_new_tokens is None else min(max_new_tokens, cfg.max_len)
    # In float64, as fairseq (and Python) compute the rule: in float32 ``a`` itself rounds,
    # and 1.3 * 90 gave 116. Capped before int(): a huge rule is infinite, not an error.
    limits = [int(min(n * max_len_a + max_len_b, cap)) for n in src_len.tolist()]
    return torch.tensor(limits, dtype=torch.long, device=src.device)


def search_limits(
    cfg: TransformerConfig, src: Tensor, options: DecodeOptions, forced: Sequence[Sequence[int]]
) -> list[int]:
    """:func:`length_limits` under ``options``, raised where a sentence's forced prefix
    (``forced[i]``, :func:`forced_ids`) needs more: the whole prefix, then EOS."""
    limits = length_limits(cfg, src, options.max_new_tokens, options.max_len_a, options.max_len_b)
    return [max(limit, len(p) + 1) if p else limit for limit, p in zip(limits.tolist(), forced)]


def banned_ids(cfg: TransformerConfig, device: torch.device) -> Tensor:
    """Ids never valid as output: PAD and BOS (the decoder's start token)."""
    return torch.tensor(sorted({cfg.pad_id, cfg.bos_id}), device=device)


def ban(scores: Tensor, banned: Tensor) -> Tensor:
    """Set the banned columns of ``scores [n, V]`` to -inf, in place; returns ``scores``."""
    return scores.index_fill_(1, banned, float("-inf"))


def forced_ids(
    prefix: Sequence[Sequence[int]] | None, cfg: TransformerConfig, rows: int
) -> list[list[int]]:
    """The forced first output tokens of each of ``rows`` sentences (a target prefix, as
    CTranslate2's ``target_prefix``; [] where none), each checked against the target
    vocabulary and the model's positions."""
    try:  # index(): integers only, not a float or a character to truncate or parse
        forced = [[operator.index(i) for i in p] for p in ([] if prefix is None else prefix)]
    except TypeError:
        raise DecodeError("prefix: per sentence, a sequence of token ids (integers)") from None
    if forced and len(forced) != rows:
        raise DecodeError(f"prefix: {len(forced)} prefixes for {rows} sentences")
    if not any(forced):  # none given, or all empty: none forced
        return [[] for _ in range(rows)]
    longest = max(map(len, forced), default=0)
    if longest >= cfg.max_len:
        raise DecodeError(
            f"prefix: {longest} tokens leave no room for EOS within max_len={cfg.max_len}"
        )
    ids = {i for p in forced for i in p}
    outside = sorted(i for i in ids if not 0 <= i < cfg.tgt_vocab_size)
    if outside:
        raise DecodeError(
            f"prefix: id {outside[-1]} is outside the target vocabulary [0, {cfg.tgt_vocab_size})"
        )
    if ids & {cfg.eos_id, cfg.pad_id, cfg.bos_id}:
        raise DecodeError("prefix: EOS, PAD and BOS cannot be forced")
    return forced


def force(logp: Tensor, forced: Tensor | None) -> Tensor:
    """Rows of ``logp [n, V]`` with ``forced[i] >= 0`` keep only that token's log-prob (every
    other token -inf), in place; returns ``logp``. The forced tokens count in the score."""
    if forced is None:
        return logp
    rows = (forced >= 0).nonzero().squeeze(1)
    if rows.numel():
        tokens = forced[rows]
        kept = logp[rows, tokens]
        logp[rows] = float("-inf")
        logp[rows, tokens] = kept
    return logp


class DecodeStep:
    """The rows being decoded, for one model or an ensemble: the source ``src [n, S]``
    (right-padded), and per model its encoder output ``memory [n, S, d_model]`` and a ragged
    :class:`~aiayn.model.transformer.DecoderState` (each row at its own target position).

    One source row serves ``group`` consecutive target rows: the beams of one sentence share
    its encoder output and encoder-decoder keys/values instead of holding copies (beam
    search, whose beams only leave together). ``expand`` repeats each source row that many
    times instead (the samples of sampling, which leave one by one). Rows leave with
    :meth:`keep`, move within their sentence with :meth:`reorder` and arrive with
    :meth:`join`, so no work is spent on finished rows. ``use_cache=False`` recomputes the
    whole output so far every step: the slow reference the cache is tested against (every row
    then holds its own copy of the source). With several models, :meth:`logits` gives the
    log of their averaged next-token probabilities (fairseq's ensemble rule).
    """

    def __init__(
        self,
        models: Models,
        src: Tensor,
        *,
        group: int = 1,
        expand: int = 1,
        use_cache: bool = True,
    ):
        self.models = as_list(models)
        self.memory = [model.encode(src) for model in self.models]  # each [B, S, d_model]
        self.src = src
        if not use_cache:  # no shared cache to read: each row its own copy of the source
            group, expand = 1, expand * group
        if expand > 1:
            self.memory = [m.repeat_interleave(expand, dim=0) for m in self.memory]
            self.src = src.repeat_interleave(expand, dim=0)
        self.group = group
        self.states: list[DecoderState] | None = None
        if use_cache:
            self.states = [m.start_state(mem, group) for m, mem in zip(self.models, self.memory)]
        # Per-step scratch reused across steps (rows only leave between joins): a fresh
        # [n, V] tensor every step would cost a page fault per 4 KiB on a CPU.
        self._scratch: dict[str, Tensor] = {}

    @property
    def width(self) -> int:
        """Source positions per row (the longest source, padding included)."""
        return self.src.size(1)

    def logits(self, decoded: Tensor) -> Tensor:
        """decoded ``[n, t]`` (BOS + tokens so far, one row per live row; with a cache only
        its last column is read) -> next-token logits ``[n, V]`` (an ensemble: the log of
        the mean probability). The result may be overwritten by the next call."""
        out = [self._logits(i, decoded) for i in range(len(self.models))]
        if len(out) == 1:
            return out[0]
        logp = torch.stack([torch.log_softmax(o.float(), dim=-1) for o in out])  # [M, n, V]
        return torch.logsumexp(logp, dim=0) - math.log(len(out))

    def normalise(self, logits: Tensor, banned: Tensor) -> Tensor:
        """Next-token log-probs ``[n, V]`` (float32) of ``logits [n, V]`` (left as they
        are), the ``banned`` ids at -inf, in reused memory (valid until the next call).
        They are normalised over the whole vocabulary before the ban: banning first would
        renormalise over fewer tokens and change the scores. One fused log_softmax (on a
        CPU 1.5x-5x faster than logsumexp alone); its out= form is torch._log_softmax."""
        n, V = logits.shape
        out = self._buffer("logp", n, V, torch.float32)
        return ban(torch._log_softmax(logits.float(), -1, False, out=out), banned)

    def _logits(self, i: int, decoded: Tensor) -> Tensor:
        model, memory = self.models[i], self.memory[i]
        if self.states is None:
            return model.decode(decoded, memory, self.src)[:, -1]
        x = model.decode(decoded[:, -1:], memory, self.src, self.states[i], project=False)[:, -1]
        n, V, uses = x.size(0), model.cfg.tgt_vocab_size, model.projection_buffers(x)
        out = self._buffer(f"logits{i}", n, V, x.dtype) if uses >= 1 else None
        work = self._buffer("work", n, V, x.dtype) if uses == 2 else None
        return model.project(x, out=out, work=work)

    def _buffer(self, name: str, n: int, V: int, dtype: torch.dtype) -> Tensor:
        """``[n, V]`` scratch: the first rows of a kept tensor."""
        buf = self._scratch.get(name)
        if buf is None or buf.size(0) < n or buf.size(1) != V or buf.dtype != dtype:
            device = self.src.device
            buf = self._scratch[name] = torch.empty(n, V, dtype=dtype, device=device)
        return buf[:n]

    def reorder(self, rows: Tensor) -> None:
        """Reselect rows ``rows [n']``, each taken from a row of its own sentence (beam
        reselection): a sentence's rows hold the same source, so only the self-attention
        cache moves."""
        for state in self.states or ():
            state.reorder(rows, cross=False)

    def keep(self, rows: Tensor, sources: Tensor) -> None:
        """Keep only target ``rows [n']`` (in that order; beam moves may come in the same
        gather); with ``group > 1`` they are whole sentences, of source rows ``sources``
        (with ``group`` 1 each target row is its own source row)."""
        if self.group == 1:
            sources = rows
        self.memory, self.src = [m[sources] for m in self.memory], self.src[sources]
        for state in self.states or ():
            state.reorder(rows, sources)

    def join(self, other: DecodeStep) -> None:
        """Append the rows of ``other`` (the same models, both cached), each source padded
        on the right to the longer one (the padding mask hides it)."""
        if self.states is None or other.states is None:
            raise DecodeError("only cached rows can join a running search")
        width, pad_id = max(self.width, other.width), self.models[0].cfg.pad_id
        self.src = torch.cat([_pad_right(s, width, pad_id) for s in (self.src, other.src)])
        self.memory = [
            torch.cat([_pad_right(a, width, 0.0), _pad_right(b, width, 0.0)])
            for a, b in zip(self.memory, other.memory)
        ]
        for mine, theirs in zip(self.states, other.states):
            mine.join(theirs)

    def crop(self, width: int) -> None:
        """Drop source positions past ``width`` (after the sentences with the longest
        sources left) and the cached target columns no row uses any more."""
        self.src, self.memory = self.src[:, :width], [m[:, :width] for m in self.memory]
        for state in self.states or ():
            state.crop(width)


def _pad_right(t: Tensor, width: int, value: float) -> Tensor:
    """Pad dim 1 of ``t`` ([n, S] or [n, S, d]) to ``width`` with ``value``."""
    extra = width - t.size(1)
    if not extra:
        return t
    return F.pad(t, (0, extra) if t.dim() == 2 else (0, 0, 0, extra), value=value)
