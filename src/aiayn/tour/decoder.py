"""The checker of the decoder layer (tour page 10), called as aiayn's ``DecoderLayer``: the
encoder layer's checks (:mod:`aiayn.tour.layers`), and those of its two attentions, the
masked self-attention first, then the encoder-decoder attention over the source."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from aiayn.tour.attention import K_T
from aiayn.tour.layers import B, S, T, common_checks, with_weights
from aiayn.tour.report import (
    HEAD_SPLIT,
    Check,
    FoundBugError,
    Report,
    close,
    evaluating,
    expect_shape,
    first_tensor,
    name_of,
    not_a_module,
    run_checks,
)
from aiayn.tour.residual import check_residual
from aiayn.tour.scale import check_scales


def _kv_from_query(shape: list[int]) -> FoundBugError:
    """The bug of a decoder whose second attention takes its keys and values from x."""
    return FoundBugError(
        "kv_from_query",
        f"the encoder-decoder weights have shape {shape}, [B, h, T, T]: the second "
        f"attention attends over the target, not the source of length {S}. Its keys and "
        "values must come from memory (the encoder output), its queries from x.",
        "10-decoder.md",
    )


def _explain_raise(call: Callable[[Any, Any], object], causal: Tensor, sources: Tensor) -> None:
    """A decoder layer raised when called with the masks ``causal`` and ``sources``: raise
    the bug that other calls, ``call(cross_mask, self_mask)``, find, if any (the learner's
    own error stands otherwise)."""
    # Keys from the query make [.., T, T] scores, which the [.., 1, S] source mask cannot
    # meet: without the mask, such a layer runs and shows it.
    try:
        again = call(None, causal)
    except Exception:
        again = None
    if isinstance(again, (tuple, list)) and len(again) == 3:
        cross = again[2]
        if isinstance(cross, Tensor) and cross.dim() >= 2 and cross.shape[-1] == T:
            raise _kv_from_query(list(cross.shape)) from None
    # A [.., T, T] self mask given to the encoder-decoder attention cannot meet its
    # [.., T, S] scores: a self mask that broadcasts to any scores lets the layer run.
    try:
        call(sources, torch.ones(1, 1, 1, 1, dtype=torch.bool))
    except Exception:
        return
    raise FoundBugError(
        "self_mask_in_cross_attention",
        f"the layer raises with the causal self_mask [1, 1, T, T] = {[1, 1, T, T]} and "
        "runs when self_mask is [1, 1, 1, 1]: self_mask reaches the encoder-decoder "
        f"attention, whose scores are [B, h, T, S] (S = {S} source positions). Its mask "
        "is cross_mask, the source padding mask [B, 1, 1, S]; the causal self_mask belongs "
        "to the self-attention only.",
        "10-decoder.md",
    ) from None


def check_decoder_layer(layer: nn.Module, d_model: int) -> Report:
    """Check a learner's decoder layer, called as aiayn's ``DecoderLayer``:
    ``layer(x [B, T, d_model], memory [B, S, d_model], self_mask [.., T, T], cross_mask
    [B, 1, 1, S])`` returning ``(x, self-attention weights [B, h, T, T], encoder-decoder
    weights [B, h, T, S])`` (with ``need_weights=True`` when forward takes it). Bugs:
    ``self_mask_in_cross_attention``, ``kv_from_query``, ``returns_self_attention_twice``,
    ``wrong_cross_weights``, ``diagonal_masked``, ``wrong_self_weights``,
    ``cross_attention_first``, ``cross_queries_skip_self_attention``, ``future_leaks``,
    ``ignores_memory``,
    ``source_padding_leaks``, ``wrong_return``, and those of the encoder layer."""
    subject = f"check_decoder_layer({name_of(layer)})"
    if (refused := not_a_module(layer, subject, "10-decoder.md")) is not None:
        return refused
    g = torch.Generator().manual_seed(0)
    x, memory = torch.randn(B, T, d_model, generator=g), torch.randn(B, S, d_model, generator=g)
    causal = torch.ones(T, T, dtype=torch.bool).tril()[None, None]
    # A change of x that a LayerNorm keeps: 1.0 added to every feature is invisible to it,
    # so a pre-LN layer's sub-layers would never see it.
    bump = torch.randn(B, T, d_model, generator=g)
    sources = torch.ones(B, 1, 1, S, dtype=torch.bool)
    sources[1, ..., 5:] = False  # sentence 1: 5 real source tokens, then 2 pads

    def call(
        x: Tensor, memory: Tensor, grad: bool, module: nn.Module, mask: Any, self_mask: Any = causal
    ) -> object:
        if grad:
            return with_weights(module, x, memory, self_mask, mask)
        with evaluating(module):
            return with_weights(module, x, memory, self_mask, mask)

    def outputs(
        x: Tensor, memory: Tensor = memory, grad: bool = False, module: nn.Module = layer
    ) -> Sequence[Any]:
        try:
            result = call(x, memory, grad, module, sources)
        except RuntimeError:
            _explain_raise(lambda *masks: call(x, memory, grad, module, *masks), causal, sources)
            raise
        if not (isinstance(result, (tuple, list)) and len(result) == 3):
            got = (
                f"{len(result)} values"
                if isinstance(result, (tuple, list))
                else f"a {type(result).__name__}"
            )
            raise FoundBugError(
                "wrong_return",
                "a decoder layer returns (x, self-attention weights, encoder-decoder "
                f"weights), as aiayn's DecoderLayer does; this one returned {got}",
                "10-decoder.md",
            )
        return result

    def run(x: Tensor, memory: Tensor = memory, grad: bool = False) -> Tensor:
        return first_tensor(outputs(x, memory, grad)[0], "the layer")

    def weights() -> None:
        _, self_w, cross_w = outputs(x)
        if not isinstance(self_w, Tensor) or not isinstance(cross_w, Tensor):
            raise FoundBugError(
                "wrong_return",
                "the two weights must be tensors (ask for them with need_weights=True)",
                "10-decoder.md",
            )
        if self_w.dim() == 3 and cross_w.dim() == 3:  # averaged over the heads (as torch's)
            self_w, cross_w = self_w[:, None], cross_w[:, None]
        h = self_w.size(1) if self_w.dim() == 4 else 1
        expect_shape(self_w, (B, h, T, T), "The self-attention weights", "10-decoder.md")
        if not torch.allclose(self_w.sum(-1), torch.ones_like(self_w[..., 0]), atol=1e-4):
            first = float(self_w[..., 0, :].sum(-1).abs().max())
            raise FoundBugError(
                "diagonal_masked" if first < 1e-6 else "wrong_self_weights",
                f"the self-attention weights of position 0 sum to {first:.3g}, not 1: under "
                "the causal mask every position may attend to itself and the positions "
                "before it, so position 0 has one key, itself. torch.ones(T, T).tril() keeps "
                "the diagonal; tril(-1) masks it."
                if first < 1e-6
                else "the self-attention weights of a query must sum to 1 over the target",
                "04-masks.md" if first < 1e-6 else "10-decoder.md",
            )
        if cross_w is self_w or close(cross_w, self_w, atol=0):
            raise FoundBugError(
                "returns_self_attention_twice",
                f"the 'encoder-decoder' weights are the self-attention weights again "
                f"([B, h, T, T] = {list(cross_w.shape)}). Return the weights of the second "
                f"attention, over the source: [B, h, T, S] = {[B, h, T, S]}.",
                "10-decoder.md",
            )
        if tuple(cross_w.shape) == (B, h, T, T):
            raise _kv_from_query(list(cross_w.shape))
        expect_shape(cross_w, (B, h, T, S), "The encoder-decoder weights", "10-decoder.md")
        if not torch.allclose(cross_w.sum(-1), torch.ones_like(cross_w[..., 0]), atol=1e-4):
            raise FoundBugError(
                "wrong_cross_weights",
                "the encoder-decoder weights of a query must sum to 1 over the source",
                "10-decoder.md",
            )
        if (cross_w[1, ..., 5:] != 0).any():
            raise FoundBugError(
                "source_padding_leaks",
                "the encoder-decoder attention puts weight on the source's padding: give it "
                "the source padding mask (cross_mask)",
                "04-masks.md",
            )

    def order() -> None:  # the first sub-layer sees the target alone (Section 3.1)
        other = torch.randn(B, S, d_model, generator=torch.Generator().manual_seed(1))
        if not close(outputs(x)[1], outputs(x, other)[1], atol=1e-6):
            raise FoundBugError(
                "cross_attention_first",
                "the self-attention weights change when the encoder memory changes: the "
                "source reaches the layer before its self-attention. The paper's decoder "
                "layer runs the masked self-attention over the target first, then the "
                "encoder-decoder attention over the source, then the feed-forward network.",
                "10-decoder.md",
            )

    def queries() -> None:  # the encoder-decoder attention reads the self-attention's output
        earlier = x.clone()
        earlier[:, 0] += bump[:, 0]  # the later positions see it through self-attention
        later = (..., slice(1, None), slice(None))  # the queries of positions 1..
        if close(outputs(x)[2][later], outputs(earlier)[2][later], atol=1e-6):
            raise FoundBugError(
                "cross_queries_skip_self_attention",
                "changing target position 0 leaves the encoder-decoder weights of positions "
                "1.. as they were: their queries come from x itself, not from the masked "
                "self-attention's output, which mixes each position with the ones before it. "
                "Feed the second attention the first sub-layer's output, "
                "norm(x + self_attn(x)).",
                "10-decoder.md",
            )

    def scales() -> None:  # with masks that allow every key: a masked one has no log-weight
        allow_all = torch.ones(B, 1, 1, S, dtype=torch.bool), torch.ones(1, 1, T, T).bool()
        check_scales(lambda: call(x, memory, False, layer, *allow_all), B, d_model)

    def causality() -> None:
        later = x.clone()
        later[:, 3:] += bump[:, 3:]
        if not close(run(x)[:, :3], run(later)[:, :3], atol=1e-5):
            raise FoundBugError(
                "future_leaks",
                "changing target positions 3.. changed the outputs at 0..2 under a causal mask",
                "12-teacher-forcing.md",
            )

    def source() -> None:
        other = torch.randn(B, S, d_model, generator=torch.Generator().manual_seed(1))
        if close(run(x), run(x, other), atol=1e-6):
            raise FoundBugError(
                "ignores_memory",
                "the output does not change when the encoder memory "
                "changes: the source never reaches the decoder",
                "10-decoder.md",
            )
        padded = memory.clone()
        padded[1, 5:] = 50.0
        if not close(run(x)[1], run(x, padded)[1], atol=1e-4):
            raise FoundBugError(
                "source_padding_leaks",
                "what the source's pad positions hold changes the output",
                "04-masks.md",
            )

    checks: list[Check] = [("returns (x, self weights, cross weights)", lambda: outputs(x))]
    checks += common_checks(layer, run, x, d_model)
    checks += [
        ("the weights: [B, h, T, T] over the target, [B, h, T, S] over the source", weights),
        ("the masked self-attention comes first, before the source enters", order),
        ("the encoder-decoder attention's queries come from the self-attention", queries),
        ("the causal mask keeps the future out", causality),
        ("the source enters, its padding does not", source),
        ("each head scales its scores by 1/sqrt(d_k)", scales),
        (
            "the residual connections (post-LN or pre-LN)",
            lambda: check_residual(layer, lambda m, x: outputs(x, module=m)[0], x),
        ),
    ]
    hint = (
        "The layer is called batch first, in aiayn's DecoderLayer's order: layer(x [B, T, "
        "d_model], memory [B, S, d_model], self_mask [1, 1, T, T], cross_mask [B, 1, 1, S]); "
        "a forward(x, memory, src_mask, tgt_mask), the Annotated Transformer's order, swaps "
        f"the two masks. {HEAD_SPLIT} {K_T}"
    )
    return run_checks(subject, checks, "10-decoder.md", hint)
