"""Check your own Transformer code against the paper: the learner's side of the guided tour
(docs/tour/).

Each ``check_*`` function takes a function or module you wrote, with the same signature as
aiayn's own, runs property checks on it (the kind the library's tests run on the library)
and returns a :class:`Report`: true when every check passed, else naming the first bug
found, what was measured, and the tour page that explains it::

    from aiayn.tour import check_attention

    def my_attention(q, k, v, mask=None):
        ...

    print(check_attention(my_attention))

=============================== ==================================================== ====
checker                         what you wrote                                       page
=============================== ==================================================== ====
check_attention                 ``fn(q, k, v, mask=None)``: scaled dot-product attn  3
check_causal_mask               ``fn(size)``: True = may attend                      4
check_padding_mask              ``fn(ids, pad_id)``                                  4
check_pad                       ``fn(rows)``: a right-padded LongTensor              4
check_split_heads               ``split(x, n_heads)`` (and ``merge(x)``)             5
check_multi_head_attention      ``module(x, memory=None, mask=None)``                5, 10
check_positional_encoding       ``fn(max_len, d_model)``                             6
check_feed_forward              ``module(x)``                                        7
check_encoder_layer             ``layer(x, src_mask)``                               8, 9
check_decoder_layer             ``layer(x, memory, self_mask, cross_mask)``          10
check_shift_target              ``fn(tgt_ids) -> (tgt_in, tgt_out)``                 12
check_label_smoothing           ``fn(logits, target, eps, pad_id)``                  13
check_noam_rate                 ``fn(step, d_model, warmup)``                        14
=============================== ==================================================== ====
"""

from aiayn.tour.attention import check_attention
from aiayn.tour.decoder import check_decoder_layer
from aiayn.tour.example import SOURCE_PIECES, TARGET_PIECES, WORKED_SENTENCE, WORKED_VECTORS
from aiayn.tour.heads import check_multi_head_attention, check_split_heads
from aiayn.tour.layers import check_encoder_layer, check_feed_forward
from aiayn.tour.masks import check_causal_mask, check_padding_mask
from aiayn.tour.positional import check_positional_encoding
from aiayn.tour.report import Report
from aiayn.tour.shapes import Stage, trace_shapes
from aiayn.tour.training import (
    check_label_smoothing,
    check_noam_rate,
    check_pad,
    check_shift_target,
)

__all__ = [
    "SOURCE_PIECES",
    "TARGET_PIECES",
    "WORKED_SENTENCE",
    "WORKED_VECTORS",
    "Report",
    "Stage",
    "check_attention",
    "check_causal_mask",
    "check_decoder_layer",
    "check_encoder_layer",
    "check_feed_forward",
    "check_label_smoothing",
    "check_multi_head_attention",
    "check_noam_rate",
    "check_pad",
    "check_padding_mask",
    "check_positional_encoding",
    "check_shift_target",
    "check_split_heads",
    "trace_shapes",
]
