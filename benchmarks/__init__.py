"""Benchmarks of aiayn: ``python -m benchmarks.speed`` (speed against peers) and
``benchmarks/multi30k_bleu.py`` (Multi30k training and test2016 BLEU)."""
