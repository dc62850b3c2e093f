"""The two running examples of tour page 0, shared with the pictures ``make figures``
draws of them (docs/figures/figure1.png and worked_example.png)."""

from __future__ import annotations

# Attention by hand: the notes' sentence "I saw a saw", three distinct tokens, each a 2-D
# vector (no learned projections yet: queries, keys and values are the vectors themselves).
WORKED_VECTORS = {"I": (1.0, 0.0), "saw": (1.0, 1.0), "a": (-1.0, 0.0)}
WORKED_SENTENCE = ["I", "saw", "a", "saw"]

# Figure 1 with shapes: one German -> English pair, as the pieces a tokenizer might give.
SOURCE_PIECES = ["▁Ein", "▁Hund", "▁rennt", "▁über", "▁die", "▁Wiese", "."]
TARGET_PIECES = ["▁A", "▁dog", "▁runs", "▁across", "▁the", "▁meadow", "."]
