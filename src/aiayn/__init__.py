"""aiayn: the original Transformer (Vaswani et al. 2017), readable and complete."""

from aiayn.config import TransformerConfig
from aiayn.model.transformer import Transformer

__all__ = ["Transformer", "TransformerConfig"]
__version__ = "0.1.0"
