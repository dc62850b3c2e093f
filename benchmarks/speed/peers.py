"""The three training peers, built to the same sizes, and the one training step they share."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.config import TransformerConfig
from aiayn.model.embedding import PositionalEncoding, TokenEmbedding
from aiayn.model.transformer import Transformer
from aiayn.train.loss import label_smoothed_cross_entropy
from aiayn.train.recipe import Recipe

from .common import LABEL_SMOOTHING, MARIAN, OURS, TORCH_NN
from .context import autocast


class TorchNNPeer(nn.Module):
    """``torch.nn.Transformer`` (batch_first, post-LN, ReLU) between our token embedding
    (shared, x sqrt(d_model)), our sinusoidal positions and our tied output projection.
    nn.Transformer ends each stack with an extra LayerNorm; post-LN has none (paper, ours),
    so both are removed, and dropout sits where ours has it (embeddings, residuals). Masks as
    ours: source key padding, causal + target key padding."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = TokenEmbedding(cfg.tgt_vocab_size, cfg.d_model, cfg.pad_id)
        self.src_pos = PositionalEncoding(cfg.d_model, cfg.max_len, cfg.dropout)
        self.tgt_pos = PositionalEncoding(cfg.d_model, cfg.max_len, cfg.dropout)
        self.core = nn.Transformer(
            d_model=cfg.d_model,
            nhead=cfg.n_heads,
            num_encoder_layers=cfg.encoder_layers,
            num_decoder_layers=cfg.decoder_layers,
            dim_feedforward=cfg.d_ff,
            dropout=cfg.dropout,
            activation="relu",
            layer_norm_eps=cfg.layer_norm_eps,
            batch_first=True,
            norm_first=False,
        )
        self.core.encoder.norm = None
        self.core.decoder.norm = None
        # nn.Transformer's one `dropout` also drops attention weights and FFN activations;
        # ours (and Marian here) use cfg.attention_dropout (0) and no activation dropout.
        for layer in [*self.core.encoder.layers, *self.core.decoder.layers]:
            layer.dropout = nn.Identity()  # inside the FFN, between the two linears
            layer.self_attn.dropout = cfg.attention_dropout
            if hasattr(layer, "multihead_attn"):
                layer.multihead_attn.dropout = cfg.attention_dropout

    def hidden(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        pad = self.cfg.pad_id
        T = tgt_in.size(1)
        causal = torch.ones(T, T, dtype=torch.bool, device=tgt_in.device).triu_(1)  # True: hide
        src_pad = src.eq(pad)
        return self.core(
            self.src_pos(self.embed(src)),
            self.tgt_pos(self.embed(tgt_in)),
            tgt_mask=causal,
            src_key_padding_mask=src_pad,
            tgt_key_padding_mask=tgt_in.eq(pad),
            memory_key_padding_mask=src_pad,
            tgt_is_causal=True,
        )

    def project(self, h: Tensor) -> Tensor:
        return F.linear(h, self.embed.weight)


def marian_config(cfg: TransformerConfig):
    """A MarianConfig of the same size as ``cfg``: post-LN, ReLU, embeddings x sqrt(d_model),
    static sinusoidal positions (Marian's only kind), one shared and tied vocabulary."""
    from transformers import MarianConfig

    return MarianConfig(
        vocab_size=cfg.tgt_vocab_size,
        decoder_vocab_size=cfg.tgt_vocab_size,
        d_model=cfg.d_model,
        encoder_layers=cfg.encoder_layers,
        decoder_layers=cfg.decoder_layers,
        encoder_attention_heads=cfg.n_heads,
        decoder_attention_heads=cfg.n_heads,
        encoder_ffn_dim=cfg.d_ff,
        decoder_ffn_dim=cfg.d_ff,
        activation_function="relu",
        dropout=cfg.dropout,
        attention_dropout=cfg.attention_dropout,
        activation_dropout=0.0,
        max_position_embeddings=cfg.max_len,
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        pad_token_id=cfg.pad_id,
        eos_token_id=cfg.eos_id,
        bos_token_id=cfg.bos_id,
        decoder_start_token_id=cfg.bos_id,
        forced_eos_token_id=None,
    )


def build_marian(cfg: TransformerConfig, device: torch.device):
    from transformers import MarianMTModel

    model = MarianMTModel(marian_config(cfg)).to(device)
    with contextlib.suppress(Exception):  # the fused kernel, as ours uses
        model.set_attn_implementation("sdpa")
    return model


class MarianPeer(nn.Module):
    def __init__(self, cfg: TransformerConfig, device: torch.device):
        super().__init__()
        self.cfg, self.mt = cfg, build_marian(cfg, device)

    def hidden(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        pad = self.cfg.pad_id
        out = self.mt.model(
            input_ids=src,
            attention_mask=src.ne(pad).long(),
            decoder_input_ids=tgt_in,
            decoder_attention_mask=tgt_in.ne(pad).long(),
            use_cache=False,
        )
        return out.last_hidden_state

    def project(self, h: Tensor) -> Tensor:
        return self.mt.lm_head(h) + self.mt.final_logits_bias[0]


class OursPeer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg, self.model = cfg, Transformer(cfg)

    def hidden(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        return self.model(src, tgt_in, project=False)

    def project(self, h: Tensor) -> Tensor:
        return self.model.project(h)


def build_peer(name: str, cfg: TransformerConfig, device: torch.device, seed: int = 1):
    torch.manual_seed(seed)
    if name == OURS:
        peer = OursPeer(cfg)
    elif name == TORCH_NN:
        peer = TorchNNPeer(cfg)
    elif name == MARIAN:
        peer = MarianPeer(cfg, device)
    else:
        raise ValueError(name)
    peer = peer.to(device).train()
    recipe = Recipe()
    optimizer = torch.optim.Adam(
        peer.parameters(), lr=1e-4, betas=recipe.adam_betas, eps=recipe.adam_eps
    )
    return peer, optimizer


def train_step(
    peer, optimizer, batch, device: torch.device, bf16: bool, label: str | None = None
) -> None:
    """One update as ``aiayn.train.update.Updater`` does it (update_freq 1, no clipping), under bf16
    autocast when ``bf16``. ``label`` names the parts for the profiler."""

    def part(name: str):
        if label is None:
            return contextlib.nullcontext()
        return torch.profiler.record_function(f"{label}/{name}")

    pad = peer.cfg.pad_id
    keep = batch.tgt_out != pad
    optimizer.zero_grad(set_to_none=True)
    with part("forward"), autocast(device, bf16):
        hidden = peer.hidden(batch.src, batch.tgt_in)  # [B, T, d]
        logits = peer.project(hidden[keep])  # [N, V]: real positions only
    with part("loss"):
        loss, _, _ = label_smoothed_cross_entropy(logits, batch.tgt_out[keep], LABEL_SMOOTHING, pad)
    with part("backward"):
        (loss / batch.n_tgt_tokens).backward()
    with part("optimizer"):
        optimizer.step()
