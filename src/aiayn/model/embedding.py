"""Embeddings and positional encoding (Sections 3.4 and 3.5)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from aiayn.errors import ModelInputError


def sinusoidal_table(max_len: int, d_model: int) -> Tensor:
    """``[max_len, d_model]`` table with PE[pos, 2i] = sin(pos / 10000^(2i/d_model)) and
    PE[pos, 2i+1] = cos(pos / 10000^(2i/d_model)) (Section 3.5)."""
    position = torch.arange(max_len, dtype=torch.float64)[:, None]  # [L, 1]
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # [ceil(d/2)] = 0, 2, 4, ...
    angle = position / torch.pow(10000.0, two_i / d_model)  # [L, ceil(d/2)]
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])  # odd d_model: one cos fewer
    return table.float()


class PositionalEncoding(nn.Module):
    """Adds position information to ``x [B, T, d_model]``, then applies dropout.

    Sinusoidal (a precomputed, non-trained buffer) or learned (one vector per position).
    ``offset`` shifts positions for incremental decoding, where x holds only the new steps:
    one int for the whole batch, or a LongTensor ``[B]`` with each row's own offset (rows
    that joined a running batch at different steps).
    """

    table: Tensor  # the sinusoidal buffer ``[max_len, d_model]``, when not learned

    def __init__(self, d_model: int, max_len: int, dropout: float, learned: bool = False):
        super().__init__()
        self.max_len = max_len
        self.dropout = nn.Dropout(dropout)
        self.learned: nn.Parameter | None
        if learned:
            self.learned = nn.Parameter(torch.empty(max_len, d_model))
            nn.init.normal_(self.learned, std=d_model**-0.5)
        else:
            self.learned = None
            self.register_buffer("table", sinusoidal_table(max_len, d_model), persistent=False)

    def forward(self, x: Tensor, offset: int | Tensor = 0) -> Tensor:
        pe = self.learned if self.learned is not None else self.table
        if isinstance(offset, Tensor):  # per row: gather [B, T] rows of the table
            if offset.dim() != 1:
                raise ModelInputError(
                    f"offset: an int or a [B] tensor of each row's, got a {offset.dim()}-D tensor"
                )
            positions = offset[:, None] + torch.arange(x.size(1), device=x.device)
            if positions.numel():  # both bounds in one copy to the host (a GPU sync)
                first, last = torch.stack(positions.aminmax()).tolist()
                self._check(first, last + 1)
            return self.dropout(x + pe[positions])
        end = offset + x.size(1)
        self._check(offset, end)
        return self.dropout(x + pe[offset:end])

    def _check(self, first: int, end: int) -> None:
        """ModelInputError unless positions ``first`` .. ``end - 1`` are in the table (a
        negative one would index it from the end, or drop the input)."""
        if first < 0:
            raise ModelInputError(f"offset {first}: positions start at 0")
        if end > self.max_len:
            raise ModelInputError(
                f"sequence reaches position {end}, past max_len={self.max_len}; "
                "raise TransformerConfig.max_len or shorten the input"
            )


def rebuild_tables(model: nn.Module, incompatible_keys: object = None) -> None:
    """Compute every sinusoidal table under ``model`` again, on its parameters' device and
    in their dtype: a load_state_dict post-hook (:class:`~aiayn.model.Transformer`'s).

    A state dict holds no table, so a model built on the meta device and loaded with
    ``assign=True`` kept a table with no data (torch's device error at the first forward),
    and one moved with ``to_empty()`` kept uninitialised memory (silently wrong outputs);
    bf16 weights assigned to a float32 model met a float32 table (a dtype error)."""
    first = next(model.parameters())
    for module in model.modules():
        if isinstance(module, PositionalEncoding) and module.learned is None:
            max_len, d_model = module.table.shape
            dtype = first.dtype if first.is_floating_point() else module.table.dtype
            module.table = sinusoidal_table(max_len, d_model).to(first.device, dtype)


class TokenEmbedding(nn.Module):
    """Token ids ``[B, T]`` -> vectors ``[B, T, d_model]`` multiplied by sqrt(d_model) (3.4;
    ``scale=False``: not multiplied, as Marian models without ``scale_embedding``).

    The pad row starts at zero and the lookup gives it no gradient (``padding_idx``). Tied
    to the output projection (the default), it is also the pad's output weight and trains
    there, which changes no output: pad keys are masked, and pad is never decoded.
    """

    def __init__(self, vocab_size: int, d_model: int, pad_id: int, scale: bool = True):
        super().__init__()
        self.scale = math.sqrt(d_model) if scale else None
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model))
        self.pad_id = pad_id
        # d_model**-0.5 keeps the scaled embedding at unit variance, and the tied output
        # projection starts with logits of unit variance too (as fairseq and tensor2tensor).
        nn.init.normal_(self.weight, std=d_model**-0.5)
        with torch.no_grad():
            self.weight[pad_id].zero_()

    def forward(self, ids: Tensor) -> Tensor:
        x = nn.functional.embedding(ids, self.weight, padding_idx=self.pad_id)
        return x * self.scale if self.scale is not None else x
