"""Looking inside a model: layer table, attention heatmaps, training curves."""

from aiayn.inspect.summary import summary

__all__ = ["summary"]
