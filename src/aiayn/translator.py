"""A trained model as a text-to-text function: tokenize, decode, detokenize (the attention
behind a translation is :mod:`aiayn.inspect.maps`'s)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiayn.checkpoint import check_inference_settings, load_inference, resolve_checkpoint
from aiayn.data.batching import check_batch_size, sorted_batches
from aiayn.data.tokenizer import Tokenizer, unencodable
from aiayn.decode import BeamEngine, DecodeOptions, Hypothesis, search
from aiayn.decode.core import as_list
from aiayn.decode.options import length_rule, resolve
from aiayn.errors import AiaynError
from aiayn.model.transformer import Transformer


@dataclass
class Translation:
    """One output for one input line: its ``text``, the output ``pieces`` and ``ids`` (no
    BOS or EOS), ``log_prob`` (total log-probability under the model, EOS and any forced
    prefix included), ``score`` (the log-prob over the length penalty, what the search
    ranks by) and, when asked for, the ``alignment``: (source word, output word) pairs."""

    text: str
    pieces: list[str]
    ids: list[int]
    log_prob: float
    score: float
    alignment: list[tuple[int, int]] | None = None


def _check_fits(models: list[Transformer], tokenizer: Tokenizer) -> None:
    """AiaynError unless every model was built for ``tokenizer`` (what ``from_dir`` checks
    of a checkpoint): a model with other special ids decodes nonsense without a word."""
    for model in models:
        for name in ("src_vocab_size", "tgt_vocab_size", "pad_id", "bos_id", "eos_id"):
            ours, theirs = getattr(model.cfg, name), getattr(tokenizer, name)
            if ours != theirs:
                raise AiaynError(
                    f"Translator: the model's {name} is {ours} but the tokenizer's is "
                    f"{theirs}; use the tokenizer the model was trained with"
                )


class Translator:
    """Translates lists of sentences, keeping line alignment.

    Sentences are decoded in length-sorted batches (little padding) and returned in input
    order; an empty (or blank) input line gives an empty output line. Several models (one
    tokenizer, one target vocabulary) decode as an ensemble that averages their next-token
    probabilities; ``model`` is the first of them.
    """

    def __init__(
        self,
        model: Transformer | Sequence[Transformer],
        tokenizer: Tokenizer,
        generation: dict[str, Any] | None = None,
    ):
        self.models = as_list(model)  # each call decodes in eval mode, leaving the mode as is
        self.model, self.tokenizer = self.models[0], tokenizer
        if tokenizer is not None:
            _check_fits(self.models, tokenizer)
        self.device = next(self.model.parameters()).device
        # What options=None means: the paper's beam 4 and alpha 0.6, or for an imported
        # model the generation settings it was published with (decoding as generate() does).
        self.defaults = DecodeOptions.from_generation(generation) if generation else DecodeOptions()
        self.generation = dict(generation or {})  # as imported: what /info and summary show

    @classmethod
    def from_dir(
        cls,
        model_dir: str | Path | Sequence[str | Path],
        checkpoint: str | Path | Sequence[str | Path] = "auto",
        device: str = "cpu",
        quantize: bool = False,
        precision: str = "fp32",
    ) -> Translator:
        """``checkpoint``: auto, best, last, averaged or a file; ``quantize``: int8 dynamic
        quantization, CPU only; ``precision``: fp32 or bf16 weights (see
        :func:`aiayn.checkpoint.load_model`). Several directories, or several checkpoints
        of one, make an ensemble; their tokenizers must be the same. An imported model's
        generation settings become :attr:`defaults` (those of the first model)."""
        check_inference_settings(device, quantize, precision)  # before reading any file
        dirs = _paths(model_dir, "model_dir", "a model directory")
        names = _paths(checkpoint, "checkpoint", "auto, best, last, averaged or a file")
        paths = [resolve_checkpoint(d, n) for d, n in _members(dirs, names)]
        models, tokenizer, generation = [], None, None
        for path in paths:
            model, tok, settings = load_inference(path, device, quantize, precision)
            generation = settings if generation is None else generation
            if tokenizer is not None and tok.to_bytes() != tokenizer.to_bytes():
                raise AiaynError(
                    f"ensemble: {path} has another tokenizer than {paths[0]}; ensembled "
                    "models must share one vocabulary"
                )
            models.append(model)
            tokenizer = tok
        if tokenizer is None:
            raise AiaynError("no model to load: no model directory or no checkpoint given")
        try:
            return cls(models, tokenizer, generation)
        except AiaynError as e:
            raise AiaynError(f"{', '.join(map(str, paths))}: {e}") from None

    @property
    def length_rule(self) -> str:
        """How long an output may get by default, and where that rule comes from."""
        return length_rule(self.defaults, self.max_len, self.generation)

    @property
    def max_len(self) -> int:
        """The positions every source and output must fit in: an ensemble's fewest."""
        return min(m.cfg.max_len for m in self.models)

    @property
    def max_source_tokens(self) -> int:
        """The longest source the model takes whole: its positions (:attr:`max_len`)."""
        return self.max_len

    def encode(self, line: str) -> list[int]:
        """Source ids of ``line`` (as the tokenizer makes them, EOS last for Marian models),
        cut to :attr:`max_source_tokens`; [] for a blank line."""
        return self.tokenizer.encode(line, self.max_source_tokens) if line.strip() else []

    def translate(
        self,
        lines: Sequence[str],
        options: DecodeOptions | None = None,
        prefixes: Sequence[str] | None = None,
        *,
        first_line: int = 0,
        batch_size: int = 64,
        on_batch: Callable[[int], object] | None = None,
        **settings: Any,
    ) -> list[list[str]]:
        """The texts of :meth:`translations` (same arguments): ``n_best`` per line, best
        first (samples in the order drawn), padded with "" where a search finished fewer
        (a blank line gets only "")."""
        options = self.options(options, settings)
        found = self.translations(
            lines,
            options,
            prefixes,
            first_line=first_line,
            batch_size=batch_size,
            on_batch=on_batch,
            scores=False,
        )
        return [n_best_texts([t.text for t in out], options.n_best) for out in found]

    def translations(
        self,
        lines: Sequence[str],
        options: DecodeOptions | None = None,
        prefixes: Sequence[str] | None = None,
        *,
        first_line: int = 0,
        batch_size: int = 64,
        on_batch: Callable[[int], object] | None = None,
        scores: bool = True,
        **settings: Any,
    ) -> list[list[Translation]]:
        """For each line its outputs as :class:`Translation` objects (texts, pieces,
        log-probs, scores; word alignments: :func:`aiayn.inspect.maps.add_alignments`).
        ``options``: a :class:`DecodeOptions` (default :attr:`defaults`: beam 4 and alpha
        0.6, or an imported model's generation settings; beam 1 is greedy decoding), with
        the keyword ``settings`` given (beam, alpha, n_best, ...) applied. ``prefixes[i]``
        (text) is forced as the start of line i's outputs (default: ``options.prefix`` for
        every line). Line i is line ``first_line + i`` of the whole input, which seeds its
        samples. ``scores=False`` lets greedy decoding skip the log-probs (then 0)."""
        options = self.options(options, settings)
        _check_texts(lines, "lines")
        if prefixes is not None:
            _check_texts(prefixes, "prefixes")
        if prefixes is not None and len(prefixes) != len(lines):
            raise AiaynError(f"{len(prefixes)} prefixes for {len(lines)} input lines")
        if prefixes is not None and options.prefix:
            raise AiaynError("give prefixes, one per line, or a prefix for every line, not both")
        ids = [self.encode(line) for line in lines]
        if prefixes is None:
            forced = [prefix_ids(self.tokenizer, options.prefix)] * len(lines)
        else:
            tok = self.tokenizer
            forced = [prefix_ids(tok, p, f"prefixes[{i}]") for i, p in enumerate(prefixes)]
        if isinstance(first_line, bool) or not isinstance(first_line, int) or first_line < 0:
            raise AiaynError(f"first_line must be a line number >= 0, got {first_line!r}")
        lines_at = range(first_line, first_line + len(lines))
        hyps = self.hypotheses(ids, options, forced, lines_at, batch_size, on_batch, scores)
        return [[self._translation(h) for h in candidates] for candidates in hyps]

    def options(
        self, options: DecodeOptions | None = None, settings: dict[str, Any] | None = None
    ) -> DecodeOptions:
        """``options`` (default: :attr:`defaults`) with the keyword ``settings`` of the
        methods above that are not None applied; an unknown setting is an error."""
        settings = settings or {}
        unknown = sorted(set(settings) - set(DecodeOptions.__dataclass_fields__))
        if unknown:
            raise AiaynError(f"unknown decoding setting(s): {', '.join(unknown)}")
        return resolve(self.defaults if options is None else options, **settings)

    def _translation(self, h: Hypothesis) -> Translation:
        piece = self.tokenizer.id_to_piece
        text = self.tokenizer.decode(h.tokens)
        return Translation(text, [piece(i) for i in h.tokens], h.tokens, h.log_prob, h.score)

    def hypotheses(
        self,
        ids: Sequence[Sequence[int]],
        options: DecodeOptions,
        prefixes: Sequence[Sequence[int]] | None = None,
        lines: Sequence[int] | None = None,
        batch_size: int = 64,
        on_batch: Callable[[int], object] | None = None,
        scores: bool = True,
    ) -> list[list[Hypothesis]]:
        """The searches' hypotheses for each row of source ``ids`` (none for an empty row),
        with ``prefixes[i]`` forced and ``lines[i]`` (default i) seeding row i's samples
        (``scores=False``: see :func:`aiayn.decode.search`). A batch holds ``batch_size``
        rows, or with sampling ``batch_size // n_best`` of them, at least one (each sample
        is a decoder row with a cache of its own: 64 lines of 1,024 samples held 12 GB).
        ``on_batch(n)`` is told of each ``n`` rows done, the empty ones first, so the counts
        add up to ``len(ids)``."""
        check_batch_size(batch_size)
        if options.sampling:
            batch_size = max(1, batch_size // options.n_best)
        results: list[list[Hypothesis]] = [[] for _ in ids]
        lines = range(len(ids)) if lines is None else lines
        if on_batch is not None and (empty := sum(not row for row in ids)):
            on_batch(empty)
        for index, src in sorted_batches(ids, batch_size, self.model.cfg.pad_id):
            found = search(
                self.models,
                src.to(self.device),
                options,
                prefix=[prefixes[i] for i in index] if prefixes is not None else None,
                lines=[lines[i] for i in index],
                scores=scores,
            )
            for i, candidates in zip(index, found):
                results[i] = candidates
            if on_batch is not None:
                on_batch(len(index))
        return results

    def continuous_search(self, options: DecodeOptions) -> BeamEngine:
        """The engine of these models (an ensemble too) that sentences join and leave
        between decoding steps (``aiayn serve``'s continuous batching): feed it
        right-padded source ids, with forced prefixes, their own ``alpha`` and line
        indices per add. Each sentence's outputs are those :meth:`hypotheses` gives it
        with ``options``."""
        return BeamEngine(self.models, options)


def prefix_ids(tokenizer: Tokenizer, text: str, name: str = "prefix") -> list[int]:
    """Target ids that force ``text`` ([] for an empty one). AiaynError naming ``name``
    (if any) and the characters the target vocabulary lacks: forced, they would be <unk>
    (written " ⁇ "), so the output would not start with the text asked for."""
    ids = tokenizer.encode_target(text) if text else []
    unk = tokenizer.unk_id
    if unk in ids:
        lacking = sorted(c for c in set(text) if unk in tokenizer.encode_target(c))
        what = " ".join(map(repr, lacking)) if lacking else repr(text)
        raise AiaynError(
            f"{name + ': ' if name else ''}the model's vocabulary has no piece for {what}; "
            "a forced prefix must be text the model can write"
        )
    return ids


def n_best_texts(texts: list[str], n_best: int) -> list[str]:
    """One line's output texts padded with "" to ``n_best`` (a search may finish fewer;
    a blank line gets none): what the command line and the server print."""
    return texts + [""] * (n_best - len(texts))


def _check_texts(texts: object, name: str) -> None:
    """AiaynError naming ``name`` and the item unless ``texts`` is a sequence of valid
    Unicode strings (a str alone would be translated letter by letter)."""
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise AiaynError(f"{name}: a list of texts, not {type(texts).__name__}")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise AiaynError(f"{name}[{i}]: text, not {type(text).__name__}")
        if (at := unencodable(text)) is not None:
            raise AiaynError(f"{name}[{i}]: not valid Unicode (character {at})")


def _paths(value: object, name: str, one: str) -> list[str | Path]:
    """``value``, one path or a list (or tuple) of them, as a list; AiaynError naming
    ``name`` and what ``one`` of them is otherwise (None, a number, a set)."""
    found = [value] if isinstance(value, (str, Path)) else value
    if not isinstance(found, (list, tuple)) or not all(isinstance(p, (str, Path)) for p in found):
        raise AiaynError(f"{name} must be {one} (or a list of them), got {value!r}")
    return list(found)


def _members(dirs: list, names: list) -> list[tuple]:
    """(model directory, checkpoint) of each ensemble member: one checkpoint name for every
    directory, several checkpoints of one directory, or one per directory."""
    if len(names) == 1:
        return [(d, names[0]) for d in dirs]
    if len(dirs) == 1:
        return [(dirs[0], n) for n in names]
    if len(dirs) != len(names):
        raise AiaynError(
            f"ensemble: {len(dirs)} model directories but {len(names)} checkpoints "
            "(give one checkpoint for all, one per directory, or several of one directory)"
        )
    return list(zip(dirs, names))
