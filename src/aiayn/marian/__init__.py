"""Pretrained models in and out: transformers' MarianMTModel folders (the ~1,400 OPUS-MT
models are such folders) <-> aiayn model directories, without transformers.

- :func:`import_marian` (``aiayn import marian HF_DIR --out MODEL_DIR``): a local folder
  -> a model directory that every aiayn command takes, fine-tuning included;
- :func:`export_marian` (``aiayn export marian --model MODEL_DIR --out HF_DIR``): back to a
  folder transformers loads.

The conversion itself (config fields, the d_model permutation that maps Marian's
positions onto aiayn's, weight names) is in :mod:`aiayn.marian.weights`.
"""

from aiayn.marian.export import export_marian
from aiayn.marian.folder import MarianFolder, import_marian

__all__ = ["MarianFolder", "export_marian", "import_marian"]
