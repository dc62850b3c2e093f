"""What the HTTP side knows of the model, and admitting a request before it reaches the
worker: every size is checked before any heavy work, tokenization runs off the event
loop, and a request whose attention maps would be too large is refused (413) up front.

Order of the checks (cheapest first, each a 4xx naming the field or limit): the API key,
the Content-Type (415), the body's size (413), its JSON and fields (400/422, see
:mod:`aiayn.serve.protocol`), the count of sentences that ask for attention (413), then,
in a worker thread, the tokens of each source and prefix (422) and the attention
weights they would make (413). Only then does the job reach the model worker, whose
cache budget refuses what could never fit (413).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aiayn.config import TransformerConfig
from aiayn.data.tokenizer import Tokenizer
from aiayn.decode import DecodeOptions
from aiayn.errors import AiaynError
from aiayn.quantize import parameter_count
from aiayn.serve.jobs import (
    CancelledJobError,
    DeadlineError,
    Outcome,
    QueueFullError,
    Result,
    StoppedError,
    TooLargeError,
)
from aiayn.serve.protocol import CLIENT_GONE, ApiError, TranslateRequest, request_prefixes
from aiayn.translator import Translator, n_best_texts, prefix_ids


@dataclass(frozen=True)
class ModelInfo:
    """What the HTTP side keeps of the translator: its tokenizer, the model's configuration
    and size and where it runs; no weights (a worker process holds the only copy)."""

    tokenizer: Tokenizer
    cfg: TransformerConfig  # of the (first) model
    models: int  # ensembled models (1: a single model)
    parameters: int  # of them all
    device: str
    max_source_tokens: int
    defaults: DecodeOptions  # what a request decodes with where it sets nothing
    length_rule: str  # how long an output may get by default, and where the rule is from

    @classmethod
    def of(cls, translator: Translator, device: str | None = None) -> ModelInfo:
        """``translator``'s, running on ``device`` (default: where it is)."""
        model, device = translator.model, device or str(translator.device)
        return cls(
            translator.tokenizer,
            model.cfg,
            len(translator.models),
            sum(parameter_count(m) for m in translator.models),  # int8 layers' too
            device,
            translator.max_source_tokens,
            translator.defaults,
            translator.length_rule,
        )

    @property
    def special_ids(self) -> frozenset[int]:
        """Target ids that no forced prefix may hold: EOS, PAD, BOS."""
        return frozenset({self.cfg.eos_id, self.cfg.pad_id, self.cfg.bos_id})

    def detokenize(self, candidates: Sequence[Sequence[int]], n_best: int) -> list[str]:
        """Texts of one line's n-best ids, padded with "" to ``n_best``."""
        return n_best_texts([self.tokenizer.decode(list(t)) for t in candidates], n_best)


def check_attention_sentences(req: TranslateRequest, limit: int) -> None:
    """413 for a request that asks for attention maps of more than ``limit`` sentences:
    checked before tokenizing anything (the maps of every layer, head and kind of each
    sentence grow with the square of its length; the web page asks for one)."""
    if req.attention and len(req.src) > limit:
        raise ApiError(
            413,
            f"attention: {len(req.src)} sentences ask for attention maps, at most {limit} may "
            "(send the others without attention)",
        )


# Characters a text may hold per token of the model's positions before it is refused
# untokenized: real text has a few per token, and tokenizing a megabyte costs a second of
# CPU that the requests beside it wait for.
CHARACTERS_PER_TOKEN = 64


def too_long(text: str, tokens: int) -> str | None:
    """Why ``text`` is refused before it is tokenized: more characters besides whitespace
    (whose runs the tokenizer collapses) than any text of at most ``tokens`` tokens could
    reasonably hold (:data:`CHARACTERS_PER_TOKEN` per token); else None."""
    if len(text) <= (most := CHARACTERS_PER_TOKEN * tokens):
        return None  # short enough whatever it holds: not counted
    if (n := sum(map(len, text.split()))) <= most:
        return None
    return (
        f"{n} characters besides whitespace, more than {most} ({CHARACTERS_PER_TOKEN} per "
        f"token of the {tokens} the model takes): refused without tokenizing it"
    )


def encode_request(
    req: TranslateRequest, info: ModelInfo
) -> tuple[list[list[int]], list[list[int]] | None]:
    """The source ids of each sentence ([] for a blank one) and the forced prefix ids (see
    :func:`~aiayn.serve.protocol.request_prefixes`); 422 naming the first field over its
    limit. CPU work on up to a whole body of text: call it off the event loop."""
    src, limit = [], info.max_source_tokens
    for i, line in enumerate(req.src):
        if (why := too_long(line, limit)) is not None:
            raise ApiError(422, f"src.{i}: {why}")
        ids = info.tokenizer.encode(line) if line.strip() else []
        if len(ids) > limit:
            raise ApiError(422, f"src.{i}: {len(ids)} tokens, the model takes at most {limit}")
        src.append(ids)

    def encode(text: str) -> list[int]:
        if (why := too_long(text, limit)) is not None:
            raise AiaynError(why)  # request_prefixes names the prefix
        return prefix_ids(info.tokenizer, text, name="")  # request_prefixes names it

    # A prefix leaves room for EOS within the positions, an ensemble's fewest (as a source).
    positions = info.max_source_tokens
    return src, request_prefixes(req, encode, positions - 1, info.special_ids)


def attention_weights(
    src: Sequence[Sequence[int]], cfg: TransformerConfig, output_limits: Sequence[int]
) -> int:
    """An upper bound on the weights that the attention maps of ``src`` hold (output i at
    most ``output_limits[i]`` tokens, a forced prefix included): every layer and head of
    encoder self-attention (S x S), decoder self-attention (T x T) and encoder-decoder
    attention (T x S)."""
    per_head = sum(
        cfg.encoder_layers * len(s) ** 2 + cfg.decoder_layers * (t * t + t * len(s))
        for s, t in zip(src, output_limits, strict=True)
        if s
    )
    return per_head * cfg.n_heads


def check_attention_weights(count: int, limit: int) -> None:
    """413 when the attention maps of a request may hold more than ``limit`` weights."""
    if count > limit:
        raise ApiError(
            413,
            f"attention: the maps of this request may hold {count} weights, more than the "
            f"limit of {limit}: send fewer or shorter sentences with attention",
        )


def answer(outcome: Outcome) -> Result:
    """The result of a job that ended, or the HTTP error that says why there is none."""
    try:
        return outcome.unwrap()
    except TooLargeError as e:
        raise ApiError(413, str(e)) from None
    except StoppedError as e:
        raise ApiError(503, str(e)) from None
    except DeadlineError as e:
        raise ApiError(504, str(e)) from None
    except CancelledJobError as e:
        raise ApiError(CLIENT_GONE, str(e)) from None
    except QueueFullError:
        raise
    except AiaynError as e:
        raise ApiError(500, f"translation failed: {type(e).__name__}: {e}") from None
    except Exception as e:  # the model raised: this request fails, the server goes on
        raise ApiError(500, f"translation failed: {type(e).__name__}: {e}") from None
