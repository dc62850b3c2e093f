"""aiayn against transformers' Marian on an OPUS-MT-sized model, and the round trip of a
trained aiayn model through transformers (issue 18).

    python benchmarks/marian.py speed --out bench_out/marian          # ~15 min on 2 cores
    python benchmarks/marian.py roundtrip --model runs/bench-de-en --out bench_out/marian

speed: a random MarianMTModel of OPUS-MT's size (6+6 layers, d_model 512, 8 heads, d_ff
2048, a vocabulary of 58,101 with pad last, swish, shared and tied), saved with
save_pretrained beside a SentencePiece model trained on Multi30k (its vocab.json padded
with filler pieces to 58,101) and imported with `aiayn import marian`. aiayn (its
generation settings: Hugging Face's length penalty, the forced EOS), transformers'
generate() and the CTranslate2 export of the imported model translate the same 1,000
test2016 sentences in the same sorted batches of 64, interleaved batch by batch, greedy and
beam 4, at most ``--max-new-tokens`` tokens each, on ``--threads`` threads. A random model
hardly ever says EOS, so every system runs the same number of steps; the outputs of aiayn
and transformers are compared too (they should be the same ids).

roundtrip: the model exported with `aiayn export marian`, test2016 decoded by transformers
(MarianTokenizer without the source EOS, which aiayn models never saw) and by aiayn with the
same settings (beam 4, Hugging Face's length penalty), BLEU of both; and aiayn's own
decoding (GNMT penalty) beside them.
"""

from __future__ import annotations

import argparse
import atexit
import io
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import sacrebleu
import sentencepiece as spm
import torch

from aiayn.checkpoint import BEST, load_inference
from aiayn.data.batching import pad, sorted_batches
from aiayn.data.corpus import read_lines
from aiayn.decode import DecodeOptions, search
from aiayn.marian import export_marian, import_marian

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from sample_data import multi30k_dir  # noqa: E402

OPUS_VOCAB = 58101


def opus_sized_folder(folder: Path, data: Path, seed: int = 0) -> None:
    """A random OPUS-MT-sized Marian folder with a Multi30k SentencePiece tokenizer."""
    from transformers import MarianConfig, MarianMTModel

    lines = read_lines(data / "train.de.gz")[:20000] + read_lines(data / "train.en.gz")[:20000]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=8000,
        model_type="unigram", character_coverage=1.0, num_threads=2, minloglevel=2,
    )  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("source.spm", "target.spm"):
        (folder / name).write_bytes(model.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    real = [p for p in pieces if p not in ("<unk>", "<s>", "</s>")]
    fillers = [f"<filler_{i}>" for i in range(OPUS_VOCAB - 3 - len(real))]
    vocab = {p: i for i, p in enumerate(["</s>", "<unk>", *real, *fillers, "<pad>"])}
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    config = {"separate_vocabs": False, "tokenizer_class": "MarianTokenizer"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    pad_id = len(vocab) - 1
    cfg = MarianConfig(
        vocab_size=len(vocab), d_model=512, encoder_layers=6, decoder_layers=6,
        encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
        decoder_ffn_dim=2048, activation_function="swish", max_position_embeddings=512,
        scale_embedding=True, pad_token_id=pad_id, eos_token_id=0, decoder_start_token_id=pad_id,
        forced_eos_token_id=0, share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(seed)
    hf = MarianMTModel(cfg).eval()
    hf.generation_config.update(num_beams=4, max_length=512, bad_words_ids=[[pad_id]])
    hf.save_pretrained(folder)


def interleaved(systems: dict, batches: list, rounds: int) -> dict[str, list]:
    """Each system's outputs and sentences/s (median of ``rounds`` passes): systems take
    turns batch by batch, so a slow patch of the machine hits all of them alike."""
    n = sum(len(b) for b in batches)
    rates: dict[str, list[float]] = {name: [] for name in systems}
    outputs: dict[str, list] = {}
    for _ in range(rounds):
        spent = dict.fromkeys(systems, 0.0)
        found = {name: [] for name in systems}
        for batch in batches:
            for name, run in systems.items():
                t0 = time.perf_counter()
                found[name] += run(batch)
                spent[name] += time.perf_counter() - t0
        for name in systems:
            rates[name].append(n / spent[name])
        outputs = found
    return {name: [statistics.median(rates[name]), outputs[name], rates[name]] for name in systems}


def speed(args: argparse.Namespace) -> dict:
    from transformers import MarianMTModel

    data, out = multi30k_dir(), Path(args.out)
    work = Path(tempfile.mkdtemp(prefix="marian-bench-"))
    atexit.register(shutil.rmtree, work, True)  # the model folders: about 0.9 GB
    opus_sized_folder(work / "hf", data)
    model_dir = import_marian(work / "hf", work / "aiayn")
    model, tok, generation = load_inference(model_dir / BEST)
    hf = MarianMTModel.from_pretrained(work / "hf", dtype=torch.float32).eval()
    lines = read_lines(data / "test2016.de.gz")[: args.sentences]
    ids = [tok.encode(line) for line in lines]
    batches = [[ids[i] for i in index] for index, _ in sorted_batches(ids, 64, tok.pad_id)]
    T = args.max_new_tokens
    ct2 = None
    try:
        import ctranslate2

        from aiayn.export import export_ctranslate2, match_aiayn

        ct2_dir = export_ctranslate2(model_dir, work / "ct2", quantization="float32")
        ct2 = ctranslate2.Translator(str(ct2_dir), device="cpu", intra_threads=args.threads)
        ban = match_aiayn(tok, model.cfg)["suppress_sequences"]
    except ImportError:
        print("ctranslate2 not installed: no CTranslate2 row", flush=True)
    result: dict = {"threads": args.threads, "sentences": len(lines), "max_new_tokens": T}
    for beam in (1, 4):
        options = DecodeOptions.from_generation(generation).replace(
            beam=beam, max_len_a=0.0, max_len_b=T, n_best=1
        )

        def ours(rows, options=options):
            return [h[0].tokens for h in search(model, pad(rows, tok.pad_id), options)]

        def theirs(rows, beam=beam):
            src = pad(rows, tok.pad_id)
            with torch.no_grad():
                o = hf.generate(
                    input_ids=src, attention_mask=src != tok.pad_id, num_beams=beam,
                    max_new_tokens=T, do_sample=False,
                )  # fmt: skip
            return [_until(r[1:], tok.eos_id, tok.pad_id) for r in o.tolist()]

        systems = {"aiayn": ours, "transformers": theirs}
        if ct2 is not None:

            def ctranslate(rows, beam=beam, alpha=options.alpha):
                tokens = [[tok.id_to_piece(i, source=True) for i in r] for r in rows]
                res = ct2.translate_batch(
                    tokens, beam_size=beam, max_decoding_length=T, suppress_sequences=ban,
                    length_penalty=alpha, return_scores=False,
                )  # fmt: skip
                return [[tok.piece_to_id(p) for p in r.hypotheses[0]] for r in res]

            systems["ctranslate2 (aiayn export)"] = ctranslate
        found = interleaved(systems, batches, args.rounds)
        same = sum(a == b for a, b in zip(found["aiayn"][1], found["transformers"][1]))
        rows = {name: round(v[0], 2) for name, v in found.items()}
        result[f"beam{beam}"] = {
            "sentences_per_s": rows,
            "aiayn_over_transformers": round(rows["aiayn"] / rows["transformers"], 2),
            "runs": {name: [round(r, 2) for r in v[2]] for name, v in found.items()},
            "same_output_as_transformers": f"{same}/{len(lines)}",
        }
        print(json.dumps(result[f"beam{beam}"]), flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "marian_speed.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def _until(row: list[int], eos: int, pad_id: int) -> list[int]:
    row = [t for t in row if t != pad_id]
    return row[: row.index(eos)] if eos in row else row


def roundtrip(args: argparse.Namespace) -> dict:
    from transformers import MarianMTModel, MarianTokenizer

    data, run, out = multi30k_dir(), Path(args.model), Path(args.out)
    pick = json.loads((run / "results.json").read_text())["chosen_on_val"]
    folder = export_marian(run, out / "exported", checkpoint=pick["checkpoint"], force=True)
    src_lines = read_lines(data / "test2016.de.gz")
    refs = read_lines(data / "test2016.en.gz")
    hf = MarianMTModel.from_pretrained(folder, dtype=torch.float32).eval()
    hf_tok = MarianTokenizer.from_pretrained(folder)
    model, tok, _ = load_inference(run / f"checkpoint_{pick['checkpoint']}.pt")
    hf_options = DecodeOptions(
        beam=4, alpha=pick["alpha"], length_penalty="hf", max_len_a=0.0,
        max_len_b=model.cfg.max_len - 1, forced_eos=True, early_stopping=False,
    )  # fmt: skip
    theirs, ours_hf, ours_own = [], [], []
    for start in range(0, len(src_lines), 64):
        chunk = src_lines[start : start + 64]
        enc = hf_tok(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            gen = hf.generate(
                **enc, num_beams=4, length_penalty=pick["alpha"], max_length=model.cfg.max_len
            )
        theirs += hf_tok.batch_decode(gen, skip_special_tokens=True)
        src = pad([tok.encode(s) for s in chunk], tok.pad_id)
        ours_hf += [tok.decode(h[0].tokens) for h in search(model, src, hf_options)]
        own = DecodeOptions(beam=4, alpha=pick["alpha"])
        ours_own += [tok.decode(h[0].tokens) for h in search(model, src, own)]
    bleu = {
        name: round(sacrebleu.corpus_bleu(h, [refs]).score, 2)
        for name, h in (("transformers", theirs), ("aiayn_hf_settings", ours_hf),
                        ("aiayn_own_gnmt", ours_own))
    }  # fmt: skip
    result = {
        "model": str(run),
        "chosen_on_val": pick,
        "test2016_bleu": bleu,
        "identical_outputs_transformers_vs_aiayn_hf_settings": sum(
            a == b for a, b in zip(theirs, ours_hf)
        ),
        "sentences": len(src_lines),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "marian_roundtrip.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("speed")
    p.add_argument("--out", default="bench_out/marian")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--sentences", type=int, default=1000)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=1)
    p = sub.add_parser("roundtrip")
    p.add_argument("--model", required=True, help="a run of benchmarks/multi30k_bleu.py")
    p.add_argument("--out", default="bench_out/marian")
    p.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result = speed(args) if args.what == "speed" else roundtrip(args)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
