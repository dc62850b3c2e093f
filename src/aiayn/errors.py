"""The errors aiayn raises for input a user can fix: one family, one base class.

Every message names what is wrong (the file and line, the field, the checkpoint) and never
a command-line flag: the library is used without the CLI too. The CLI prints an
:class:`AiaynError` as one line and exits with status 2; any other exception is a bug and
keeps its traceback.
"""

from __future__ import annotations


class AiaynError(ValueError):
    """Base class: input or settings that cannot be used, with a message saying why.

    A ``ValueError`` subclass, so code that caught ValueError before keeps working.
    """


class ConfigError(AiaynError):
    """A model configuration field out of range or inconsistent; names the field."""


class ModelInputError(AiaynError):
    """Tensors the model cannot take: wrong type, dtype or rank, ids outside the vocabulary,
    sequences past ``max_len``, batch sizes that disagree."""


class CorpusError(AiaynError):
    """Unusable input text; the message names the file and, where it applies, the line."""


class TokenizerError(AiaynError):
    """A SentencePiece model that is missing, corrupt or has other special ids, or input a
    tokenizer cannot take (not text, ids outside its vocabulary); names the file or item."""


class CheckpointError(AiaynError):
    """A checkpoint that is missing, truncated, corrupt or does not fit; names the file."""


class RecipeError(AiaynError):
    """A recipe file or override that cannot be used; names the file or field."""


class DecodeError(AiaynError):
    """Decoding settings out of range (beam size, n-best, length penalty, length limits)."""


class TrainingError(AiaynError):
    """Training that cannot go on: e.g. many updates in a row with a non-finite loss."""


class CollectiveError(AiaynError):
    """A collective operation between the processes of a torch.distributed job failed:
    another process died or stopped (its own log says why), or one waited past the
    collective timeout."""


class ConversionError(AiaynError):
    """A model folder of another library that cannot be imported (missing or damaged file,
    another model type), or a model that another library's format cannot hold; names the
    file or the field."""


class DownloadError(AiaynError):
    """A data set file that could not be downloaded or failed its checksum; names the URL,
    the file, and how to place it by hand."""
