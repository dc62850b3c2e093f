"""Speed against peers, side by side in one process: training, translation, decode cost
against output length, peak memory. Writes OUT/speed.json, OUT/speed.md (tables ready for
BENCHMARKS.md), OUT/decode_growth.png, OUT/profile_train_ours.txt (and the peers' profiles
in OUT/profile_train_peers.txt).

    python -m benchmarks.speed --checkpoint runs/bench-de-en/checkpoint_best.pt --out bench_out
    python -m benchmarks.speed --quick --threads 1 --out bench_quick     # smoke run, < 2 min
    python -m benchmarks.speed --phases train --max-tokens 3300 --rounds 8   # one phase, resized
    python -m benchmarks.speed report --out bench_out   # speed.md again from speed.json only

Peers (all built here, same sizes, random weights unless stated):

* training: ours (``Transformer``) vs ``torch.nn.Transformer`` with our embeddings,
  positions and tied projection vs ``transformers``' ``MarianMTModel`` from a config. All three
  get the same batches and the same step: forward, projection of the real (non-pad) target
  positions only, label-smoothed cross-entropy 0.1 summed over real tokens, backward, Adam.
  Rounds are interleaved (A, B, C, A, B, C, ...) so machine noise hits all alike.
* translation of test2016: ours (``Translator``, batch 64) vs ``MarianMTModel.generate``
  (same batches, same number of decoder steps per batch: min_new_tokens = max_new_tokens =
  the steps our model took) vs CTranslate2 running our exported model (float32, int8);
  timed batch by batch, every system on a batch before the next batch.
* decode cost: exactly L greedy steps with our KV cache (``model.decode`` + ``DecoderState``)
  and with the whole prefix recomputed at every step.
* peak memory: each (phase, system) in its own child process, VmHWM of that process.

Data: Multi30k ($AIAYN_MULTI30K, ../shared/data/multi30k or the `aiayn data get` cache),
else the built-in sample with a throwaway tokenizer. Without --checkpoint nothing is
trained: BLEU is then not meaningful.
Needs the ``bench`` extra (transformers, psutil, matplotlib; ctranslate2 optional).

Modules: ``cli`` (command line, one run), ``context`` (sizes and settings of a run), ``data``
(data, tokenizer, model), ``peers`` (the training peers and their step), ``train``,
``translate`` (with ``ct2``), ``growth``, ``memory`` (the four phases), ``results`` (what
speed.json holds), ``report`` (speed.md from it), ``common`` (constants, small helpers).
"""
