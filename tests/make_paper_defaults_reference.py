"""Writes tests/data/paper_defaults_reference.pt: small models with the paper's defaults
(as aiayn trains them), their weights as a checkpoint stores them, fixed inputs, and what
the code of the day computes from them: teacher-forced logits, greedy and beam-4 outputs,
and the logits after three training updates (dropout on, seeded).

tests/test_paper_defaults.py checks that today's code gives the same tokens and floats
equal to a few float32 ulps (another CPU rounds differently in the last bits). The
file in the repository was written by the code *before* the Marian options (activation,
output bias, embedding scale, decoder start = pad) were added, so the test guards that
change: run this script only to regenerate it on purpose.

    PYTHONPATH=src python tests/make_paper_defaults_reference.py \
        tests/data/paper_defaults_reference.pt
"""

from __future__ import annotations

import sys

import torch

from aiayn import Transformer, TransformerConfig
from aiayn.decode import beam_search, greedy
from aiayn.train.loss import label_smoothed_cross_entropy

CONFIGS = {
    "post_ln_shared": dict(share_embeddings=True),
    "pre_ln_untied": dict(tgt_vocab_size=21, norm_first=True, tie_output=False),
    "learned_positions": dict(learned_positions=True, n_encoder_layers=1),
}


def inputs(cfg: TransformerConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded src, tgt_in (BOS first) and tgt_out (EOS last) of 3 sentences."""
    g = torch.Generator().manual_seed(7)
    src = torch.full((3, 7), cfg.pad_id)
    tgt_in = torch.full((3, 6), cfg.pad_id)
    tgt_out = torch.full((3, 6), cfg.pad_id)
    for i, (s, t) in enumerate([(7, 5), (4, 6), (2, 1)]):
        src[i, :s] = torch.randint(3, cfg.src_vocab_size, (s,), generator=g)
        body = torch.randint(3, cfg.tgt_vocab_size, (t - 1,), generator=g)
        tgt_in[i, 0], tgt_in[i, 1:t] = cfg.bos_id, body
        tgt_out[i, : t - 1], tgt_out[i, t - 1] = body, cfg.eos_id
    return src, tgt_in, tgt_out


def run(cfg_dict: dict, state: dict) -> dict:
    """What the code computes from a config dict and weights (both as a checkpoint holds
    them)."""
    cfg = TransformerConfig.from_dict(cfg_dict)
    model = Transformer(cfg)
    model.load_state_dict(state)
    model.eval()
    src, tgt_in, tgt_out = inputs(cfg)
    out = {}
    with torch.no_grad():
        out["logits"] = model(src, tgt_in)
    out["greedy"] = greedy(model, src, max_new_tokens=9)
    found = beam_search(model, src, beam_size=4, alpha=0.6, n_best=2, max_len_b=6)
    out["beam"] = [[h.tokens for h in hyps] for hyps in found]
    torch.manual_seed(3)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(3):
        loss, _, _ = label_smoothed_cross_entropy(model(src, tgt_in), tgt_out, 0.1, cfg.pad_id)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    out["losses"] = torch.stack(losses)
    model.eval()
    with torch.no_grad():
        out["logits_after_training"] = model(src, tgt_in)
    return out


def main(path: str) -> None:
    reference = {}
    for name, overrides in CONFIGS.items():
        torch.manual_seed(0)
        kwargs = dict(src_vocab_size=21, tgt_vocab_size=21, d_model=8, n_heads=2, n_layers=2)
        kwargs.update(d_ff=16, dropout=0.1, max_len=32)
        cfg = TransformerConfig(**{**kwargs, **overrides})
        state = Transformer(cfg).state_dict()
        outputs = run(cfg.to_dict(), state)
        reference[name] = {"config": cfg.to_dict(), "model": state, "outputs": outputs}
    torch.save(reference, path)


if __name__ == "__main__":
    main(sys.argv[1])
