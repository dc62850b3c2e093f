"""Looking inside a model: layer table, attention heatmaps."""

from aiayn.inspect.summary import summary

__all__ = ["summary"]
