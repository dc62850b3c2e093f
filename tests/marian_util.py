"""Helpers for the Marian tests: transformers MarianMTModel folders made here, never from
a hub. A tokenizer trained on real German-English lines (Multi30k when it is beside the
project, else the built-in sample) with a shuffled ``vocab.json`` and a ``>>fra<<``
language token; random small models whose LayerNorms, biases, ``final_logits_bias`` and
pad row are randomized too, so that a mapping bug cannot hide behind ones and zeros."""

from __future__ import annotations

import gzip
import io
import json
import random
import shutil
from pathlib import Path

import sentencepiece as spm
import torch

from sample_data import PAIRS, multi30k_dir

SPECIALS = ("</s>", "<unk>", "<pad>")


def corpus_lines(split: str = "train", n: int = 2000) -> tuple[list[str], list[str]]:
    """The first ``n`` German and English lines of Multi30k's ``split`` (the built-in
    sample when Multi30k is not there)."""
    data = multi30k_dir()
    if data is None:
        return [s for s, _ in PAIRS][:n], [t for _, t in PAIRS][:n]
    sides = []
    for lang in ("de", "en"):
        with gzip.open(data / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
            sides.append([line.rstrip("\n") for _, line in zip(range(n), f)])
    return sides[0], sides[1]


def _spm(lines: list[str], vocab_size: int) -> bytes:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size,
        model_type="unigram", hard_vocab_limit=False, character_coverage=0.995,
        num_threads=1, minloglevel=2,
    )  # fmt: skip
    return model.getvalue()


def write_tokenizer(folder: Path, spm_vocab: int = 60, separate: bool = False, seed: int = 0):
    """source.spm, target.spm, a shuffled vocab.json (``</s>`` 0, ``<unk>`` 1, ``<pad>``
    last, ``>>fra<<`` among the rest; and a larger target_vocab.json when ``separate``,
    its ``<pad>`` at the same id) and tokenizer_config.json into ``folder``; returns
    (source size, target size)."""
    folder.mkdir(parents=True, exist_ok=True)
    de, en = corpus_lines()
    target_size = spm_vocab + 10 if separate else spm_vocab  # separate sizes differ
    sides = {"source.spm": _spm(de, spm_vocab), "target.spm": _spm(en, target_size)}
    for name, data in sides.items():
        (folder / name).write_bytes(data)
    rng = random.Random(seed)

    def pieces_of(*names: str) -> list[str]:
        found = set()
        for name in names:
            processor = spm.SentencePieceProcessor(model_proto=sides[name])
            found |= {processor.id_to_piece(i) for i in range(processor.get_piece_size())}
        rest = [*sorted(found - {"<s>", *SPECIALS}), ">>fra<<"]
        rng.shuffle(rest)
        return ["</s>", "<unk>", *rest, "<pad>"]

    def write(name: str, pieces: list[str]) -> int:
        vocab = {p: i for i, p in enumerate(pieces)}
        (folder / name).write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
        return len(vocab)

    config = {"separate_vocabs": separate, "tokenizer_class": "MarianTokenizer"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    if not separate:
        n = write("vocab.json", pieces_of("source.spm", "target.spm"))
        return n, n
    source = pieces_of("source.spm")
    target = pieces_of("target.spm")[:-1]
    # On a small corpus (the built-in sample) SentencePiece stops short of the sizes asked
    # for, and the target side may come out smaller than the source. Fill it with pieces it
    # never produces, so that it is the larger vocabulary, as the sizes asked for say, and
    # its <pad> can sit at the source's pad id (one id per special token on both sides).
    filler = 0
    while len(target) < len(source):
        target.append(f"\u2581unused{filler}")
        filler += 1
    target.insert(len(source) - 1, "<pad>")
    return write("vocab.json", source), write("target_vocab.json", target)


def make_marian(
    folder: Path,
    tokenizer: Path,
    *,
    shared: bool = True,
    tied: bool = True,
    activation: str = "swish",
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    **config,
):
    """A random MarianMTModel (2+2 layers, d_model 16) saved with ``save_pretrained`` into
    ``folder`` beside a copy of the tokenizer files of ``tokenizer``, its generation
    settings banning the pad id as OPUS-MT models' do; returns the model (float32, eval
    mode)."""
    from transformers import MarianConfig, MarianMTModel

    vocab = json.loads((tokenizer / "vocab.json").read_text("utf-8"))
    target = tokenizer / "target_vocab.json"
    tgt_vocab = len(json.loads(target.read_text("utf-8"))) if target.is_file() else len(vocab)
    pad = len(vocab) - 1
    defaults = dict(
        d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=32, decoder_ffn_dim=32,
        max_position_embeddings=256, scale_embedding=True,
    )  # fmt: skip
    cfg = MarianConfig(
        vocab_size=len(vocab), decoder_vocab_size=tgt_vocab, pad_token_id=pad, eos_token_id=0,
        decoder_start_token_id=pad, forced_eos_token_id=0, activation_function=activation,
        share_encoder_decoder_embeddings=shared, tie_word_embeddings=tied,
        **{**defaults, **config},
    )  # fmt: skip
    torch.manual_seed(seed)
    model = MarianMTModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name and name.endswith("weight"):
                p.normal_(1.0, 0.3)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.3)
            elif "embed_tokens" in name or "shared" in name or "lm_head" in name:
                p.normal_(0.0, 0.3)  # the pad row too: the decoder starts from it
        model.final_logits_bias.normal_(0.0, 1.0)
    model.generation_config.bad_words_ids = [[pad]]  # as every OPUS-MT model's
    folder.mkdir(parents=True, exist_ok=True)
    model.to(dtype).save_pretrained(folder)
    for name in ("source.spm", "target.spm", "vocab.json", "target_vocab.json"):
        if (tokenizer / name).is_file():
            shutil.copy(tokenizer / name, folder / name)
    shutil.copy(tokenizer / "tokenizer_config.json", folder / "tokenizer_config.json")
    return model.float().eval()
