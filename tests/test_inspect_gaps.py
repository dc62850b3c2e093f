"""aiayn.inspect edge cases: summary()'s pass (training flags, lengths that fit the model,
the model's device), alignments that never point at an appended source EOS, and text
heatmaps of decoder self-attention that list only the visible keys."""

from __future__ import annotations

import copy

import pytest
import torch

from aiayn import Transformer
from aiayn.checkpoint import load_model, resolve_checkpoint
from aiayn.errors import AiaynError
from aiayn.inspect import maps
from aiayn.inspect.attention import text_heatmap
from aiayn.inspect.maps import AttentionMap, add_alignments
from aiayn.inspect.summary import summary
from aiayn.translator import Translation, Translator
from conftest import tiny_config


def test_summary_leaves_every_modules_training_flag_as_it_was():
    """summary() put the mode back with model.train(was_training), which set every
    submodule's flag: an encoder frozen in eval mode inside a training model came back in
    training mode (its dropout on for the rest of the run)."""
    model = Transformer(tiny_config(dropout=0.3))
    model.train()
    model.encoder.eval()
    before = {name: m.training for name, m in model.named_modules()}
    summary(model, 4, 4)
    assert {name: m.training for name, m in model.named_modules()} == before
    assert not model.encoder.training and model.decoder.training and model.training
    assert torch.is_grad_enabled()
    model.eval()
    summary(model, 4, 4)
    assert not any(m.training for m in model.modules())


def test_summary_lengths_fit_the_model_and_a_longer_one_is_refused_by_name():
    """With its defaults summary() failed for a model of max_len < 16 ("src has length 16,
    longer than max_len=8", a src the caller never passed)."""
    short = Transformer(tiny_config(max_len=8))
    assert "Output: logits [1, 8, 29]" in summary(short)
    assert "Output: logits [1, 5, 29]" in summary(short, tgt_len=5)
    assert "Output: logits [1, 16, 29]" in summary(Transformer(tiny_config()))
    table = summary(short, 3, 7, 1)  # positional lengths and depth, as the CLI passes them
    assert "Output: logits [1, 7, 29]" in table and "  layers.0" not in table
    for kwargs, name in (({"src_len": 9}, "src_len 9"), ({"tgt_len": 9}, "tgt_len 9")):
        with pytest.raises(AiaynError) as e:
            summary(short, **kwargs)
        assert str(e.value) == f"summary: {name} is longer than the model's max_len=8"
    with pytest.raises(AiaynError, match="src_len must be an integer >= 1, got 0"):
        summary(short, 0)


def test_summary_builds_its_inputs_on_the_models_device(monkeypatch):
    """summary() built its inputs on the default device: a model on a GPU failed ("src is
    on device cpu but the model is on cuda:0"). A meta model stands in for one here."""
    model = Transformer(tiny_config()).to("meta")
    seen = []

    def forward(src, tgt):
        seen.extend([src.device, tgt.device])
        return torch.empty(src.size(0), tgt.size(1), 29, device=src.device)

    monkeypatch.setattr(model, "forward", forward)
    assert "Output: logits [1, 16, 29]" in summary(model)
    assert seen == [torch.device("meta")] * 2


def test_alignments_never_point_at_the_eos_a_tokenizer_appends(sample_model_dir, monkeypatch):
    """A Marian tokenizer ends every source with EOS; an output piece whose step attended
    to it most was linked to it, reported as part of the last source word. As fairseq,
    such a piece is now aligned to the source piece it attended to most after the EOS."""
    model, tokenizer = load_model(resolve_checkpoint(sample_model_dir()))
    eos = tokenizer.eos_id
    marian = copy.copy(tokenizer)
    marian.add_source_eos = True  # as a MarianTokenizer of an OPUS-MT model
    pad = model.cfg.pad_id

    def cross_attention(model, src, tgt_in, layer):  # every row: EOS most, then piece 0
        weights = torch.zeros(*tgt_in.shape, src.size(1))
        for b, row in enumerate(src):
            weights[b, :, int((row != pad).sum()) - 1] = 0.6
            weights[b, :, 0] = 0.3
        return weights

    monkeypatch.setattr(maps, "cross_attention", cross_attention)
    plain = Translator(model, tokenizer)
    ids = [*plain.encode("Ein Hund rennt über die Wiese."), eos]
    out = plain.encode("A dog runs.")
    n_words = len(tokenizer.decode(out).split())

    def aligned(translator: Translator, sources: list[list[int]]) -> list:
        found = [[Translation("", [], out, 0.0, 0.0)] for _ in sources]
        add_alignments(translator, sources, found)
        return [outputs[0].alignment for outputs in found]

    last_word = len(tokenizer.decode(ids).split()) - 1
    assert aligned(plain, [ids]) == [[(last_word, j) for j in range(n_words)]]  # no EOS added
    short = [*plain.encode("Hund."), eos]
    assert aligned(Translator(model, marian), [ids, short, [eos], []]) == [
        [(0, j) for j in range(n_words)],
        [(0, j) for j in range(n_words)],
        [],  # the EOS alone: nothing to align to
        [],  # no source at all (an IndexError on its last id)
    ]


def test_a_text_heatmap_of_decoder_self_attention_lists_only_visible_pieces():
    """Row t of decoder self-attention sees target_in[: t + 1]; the masked later pieces
    were listed at weight 0.00 ("▁A <- <s> 1.00, ▁the 0.00, ▁m 0.00")."""
    self_attn = torch.tensor([[1.0, 0.0, 0.0], [0.8, 0.2, 0.0], [0.1, 0.3, 0.6]])
    cross = torch.tensor([[0.7, 0.2, 0.1, 0.0], [0.1, 0.1, 0.1, 0.7], [0.0, 0.0, 0.5, 0.5]])
    amap = AttentionMap(
        source=["▁Ein", "▁Hund", ".", "</s>"],
        target=["▁A", "▁dog", "</s>"],
        target_in=["<s>", "▁A", "▁dog"],
        weights={
            "encoder": [torch.eye(4)[None]],
            "decoder_self": [self_attn[None]],
            "cross": [cross[None]],
        },
    )
    assert text_heatmap(amap, kind="decoder_self").splitlines() == [
        f"{'▁A':>15} <- <s> 1.00",
        f"{'▁dog':>15} <- <s> 0.80, ▁A 0.20",
        f"{'</s>':>15} <- ▁dog 0.60, ▁A 0.30, <s> 0.10",
    ]
    assert text_heatmap(amap, kind="cross", head=1).splitlines()[0] == (
        f"{'▁A':>15} <- ▁Ein 0.70, ▁Hund 0.20, . 0.10"
    )


def test_an_ensembles_attention_rows_stop_at_its_fewest_positions(sample_model_dir):
    """An output that fills the ensemble's positions (its shortest member's max_len) ended
    without EOS, yet its map got an EOS row when the first member had more positions."""
    from dataclasses import replace

    model, tokenizer = load_model(resolve_checkpoint(sample_model_dir()))
    short = copy.deepcopy(model)
    short.cfg = replace(model.cfg, max_len=6)
    src = Translator(model, tokenizer).encode("Ein Hund rennt.")
    out = [tokenizer.piece_to_id("▁a")] * 6  # fills the 6 positions: no EOS
    for translator, rows in (
        (Translator([model, short], tokenizer), 6),
        (Translator(model, tokenizer), 7),
    ):
        (found,) = maps.attention_maps(translator, [src], [out])
        assert found is not None and len(found.target) == rows
        assert found.weights["cross"][0].shape[1] == rows
        assert (found.target[-1] == "</s>") == (rows == 7)
