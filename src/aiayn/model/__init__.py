"""Model parts, one module per section of the paper."""

from aiayn.model.attention import MultiHeadAttention, scaled_dot_product_attention
from aiayn.model.cache import CrossAttentionCache, DecoderLayerCache, SelfAttentionCache
from aiayn.model.embedding import PositionalEncoding, TokenEmbedding, sinusoidal_table
from aiayn.model.layers import DecoderLayer, EncoderLayer, FeedForward
from aiayn.model.masks import causal_mask, decoder_self_mask, padding_mask
from aiayn.model.transformer import Decoder, DecoderState, Encoder, Transformer

__all__ = [
    "CrossAttentionCache",
    "Decoder",
    "DecoderLayer",
    "DecoderLayerCache",
    "DecoderState",
    "Encoder",
    "EncoderLayer",
    "FeedForward",
    "MultiHeadAttention",
    "PositionalEncoding",
    "SelfAttentionCache",
    "TokenEmbedding",
    "Transformer",
    "causal_mask",
    "decoder_self_mask",
    "padding_mask",
    "scaled_dot_product_attention",
    "sinusoidal_table",
]
