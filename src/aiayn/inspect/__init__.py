"""Looking inside a model: layer table and attention heatmaps."""

from aiayn.inspect.summary import summary

__all__ = ["summary"]
