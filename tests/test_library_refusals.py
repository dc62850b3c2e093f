"""The library API given what it cannot use: one AiaynError that names the argument, not a
torch or Python error from deep inside, and never a silently wrong result (a negative batch
size that made every output empty, a str translated letter by letter, a length rule that
wrapped around int64, an ensemble stopped at its first model's positions)."""

from __future__ import annotations

import pytest
import torch

from aiayn import Transformer, TransformerConfig
from aiayn.checkpoint import (
    load_checkpoint,
    load_inference,
    load_model,
    resolve_checkpoint,
    save_checkpoint,
)
from aiayn.config import MAX_POSITIONS
from aiayn.decode import BeamEngine, DecodeOptions, beam_search, greedy, length_limits, search
from aiayn.decode.beam import length_penalty
from aiayn.errors import (
    AiaynError,
    CheckpointError,
    ConfigError,
    CorpusError,
    DecodeError,
    ModelInputError,
    TokenizerError,
)
from aiayn.inspect import maps
from aiayn.inspect.attention import plot_all, plot_attention, text_heatmap
from aiayn.inspect.summary import summary
from aiayn.translator import Translator
from conftest import tiny_config

SRC = torch.tensor([[4, 5, 6, 2], [7, 8, 2, 0]])


@pytest.fixture(scope="module")
def tiny() -> Transformer:
    torch.manual_seed(0)
    return Transformer(tiny_config()).eval()


@pytest.fixture(scope="module")
def translator(sample_model_dir) -> Translator:
    return Translator(*load_model(resolve_checkpoint(sample_model_dir())))


def test_a_batch_size_below_1_is_refused_not_an_empty_output(translator):
    want = translator.translate(["Ein Hund."], beam=1)
    assert want[0][0]  # a real translation
    for bad in (-1, 0, "8", 2.5):
        with pytest.raises(CorpusError, match="batch_size must be an integer >= 1"):
            translator.translate(["Ein Hund."], beam=1, batch_size=bad)
        with pytest.raises(CorpusError, match="batch_size must be an integer >= 1"):
            maps.attention_maps(translator, [[5]], [[5]], batch_size=bad)


@pytest.mark.parametrize(
    ("lines", "prefixes", "message"),
    [
        ("Ein Hund.", None, "lines: a list of texts, not str"),
        ([None], None, r"lines\[0\]: text, not NoneType"),
        (["Ein Hund.", 5], None, r"lines\[1\]: text, not int"),
        (["Ein \ud800 Hund."], None, r"lines\[0\]: not valid Unicode \(character 4\)"),
        (["Ein Hund."], [5], r"prefixes\[0\]: text, not int"),
        (["Ein Hund."], "A", "prefixes: a list of texts, not str"),
    ],
)
def test_translator_inputs_must_be_lists_of_text(translator, lines, prefixes, message):
    with pytest.raises(AiaynError, match=message):
        translator.translate(lines, prefixes=prefixes, beam=1)
    with pytest.raises(AiaynError, match=message):
        translator.translations(lines, prefixes=prefixes, beam=1)


def test_a_prefix_the_vocabulary_cannot_write_is_refused_not_forced_as_unk(translator):
    # Forced, each unknown character was <unk>: the output started with " ⁇ ", not the text.
    lines = ["Ein Hund.", "Zwei Katzen."]
    with pytest.raises(AiaynError, match=r"prefixes\[1\]: .*no piece for '中' '😀'"):
        translator.translate(lines, prefixes=["A", "Two 😀 中"], beam=1)
    with pytest.raises(AiaynError, match=r"prefix: .*no piece for '中'"):
        translator.translations(lines, prefix="中", beam=1)
    assert all(out[0].startswith("A") for out in translator.translate(lines, prefix="A", beam=1))


def test_a_long_prefix_with_an_unknown_character_is_looked_at_once_per_character(
    translator, monkeypatch
):
    """Each character was encoded once per occurrence: seconds for a long prefix (a
    server request's), while other requests waited for the tokenizer."""
    calls = []
    encode = translator.tokenizer.encode_target
    monkeypatch.setattr(
        translator.tokenizer, "encode_target", lambda t: calls.append(t) or encode(t)
    )
    with pytest.raises(AiaynError, match=r"prefix: .*no piece for '中'"):
        translator.translate(["Ein Hund."], prefix="ab " * 10_000 + "中", beam=1)
    assert len(calls) <= 5, len(calls)  # the whole text, then "a", "b", " " and "中"


@pytest.mark.parametrize(
    ("change", "name"),
    [({"eos_id": 5}, "eos_id"), ({"tgt_vocab_size": 400, "share_embeddings": False}, "tgt_vocab")],
)
def test_a_model_built_for_another_tokenizer_is_refused(translator, change, name):
    """from_dir checks a checkpoint against its tokenizer; the constructor did not: a
    model whose EOS is another id translated everything to "" without a word."""
    cfg = translator.model.cfg.to_dict() | change
    other = Transformer(type(translator.model.cfg).from_dict(cfg))
    with pytest.raises(AiaynError, match=f"the model's {name}.* but the tokenizer's"):
        Translator(other, translator.tokenizer)
    with pytest.raises(AiaynError, match=name):  # any member of an ensemble
        Translator([translator.model, other], translator.tokenizer)


def test_wrong_arguments_are_one_aiayn_error_naming_them(translator, sample_model_dir, tmp_path):
    """Each raised a KeyError, a TypeError or torch's RuntimeError from inside."""
    amap = maps.attention(translator, "Ein Hund.", beam=1)
    two = translator.translations(["Ein Hund.", "Eine Katze."], beam=1)
    one_source = [translator.encode("Ein Hund.")]
    calls = [
        (lambda: text_heatmap(amap, kind="self"), "attention kind must be one of"),
        (lambda: maps.add_alignments(translator, one_source, two), "1 sources for 2 lines"),
        (lambda: translator.translate(["Ein Hund."], first_line="3"), "first_line must be"),
        (lambda: translator.translate(["Ein Hund."], first_line=-1), "first_line must be"),
        (lambda: Translator.from_dir(sample_model_dir(), checkpoint=[]), "no model to load"),
        (lambda: Translator.from_dir(sample_model_dir(), checkpoint=None), "checkpoint must"),
        (lambda: Translator.from_dir(sample_model_dir(), checkpoint=3), "checkpoint must"),
        (lambda: Translator.from_dir(None), "model_dir must be a model directory"),
        (lambda: Translator.from_dir({sample_model_dir()}), "model_dir must"),
        (lambda: Translator.from_dir(sample_model_dir(), checkpoint=[3]), "checkpoint must"),
        (lambda: summary(translator.model, src_len=-1), "src_len must be an integer >= 1"),
        (lambda: TransformerConfig.base(100, dropout_rate=0.2), "unknown field.* dropout_rate"),
        (lambda: TransformerConfig.from_dict({"src_vocab_size": 10}), "missing.* tgt_vocab_size"),
    ]
    for call, message in calls:
        with pytest.raises(AiaynError, match=message):
            call()
    with pytest.raises(AiaynError, match="a checkpoint is a dict of entries, not a list"):
        save_checkpoint([1], tmp_path / "none.pt")  # type: ignore[arg-type]
    assert not list(tmp_path.iterdir())  # no temp file either
    # A checkpoint given as a Path (a TypeError too) is a file like its string.
    best = sample_model_dir() / "checkpoint_best.pt"
    by_path = Translator.from_dir(sample_model_dir(), checkpoint=best)
    assert by_path.translate(["Ein Hund."]) == translator.translate(["Ein Hund."])


def test_attention_of_a_sentence_that_is_not_text(translator):
    with pytest.raises(AiaynError, match="the sentence must be text, not NoneType"):
        maps.attention(translator, None)  # type: ignore[arg-type]


def test_early_stopping_is_a_bool_or_never_not_a_number():
    for bad in (1, 0, "true", None):
        with pytest.raises(DecodeError, match="early_stopping must be true, false or 'never'"):
            DecodeOptions(early_stopping=bad)
    for good in (True, False, "never"):
        assert DecodeOptions(early_stopping=good).early_stopping == good


def test_a_huge_length_rule_is_capped_not_wrapped_around(tiny):
    src = torch.tensor([[4, 5, 6, 7, 8, 9, 10, 11, 12, 2]])
    cap = tiny.cfg.max_len
    assert length_limits(tiny.cfg, src, None, 1e18, 5).tolist() == [cap]
    assert length_limits(tiny.cfg, src, None, 1.0, 10**30).tolist() == [cap]
    assert length_limits(tiny.cfg, src, None, 1.0, 5).tolist() == [15]  # as before
    out = greedy(tiny, src, max_len_a=1e18)
    assert out.size(1) > 1 or out[0, 0] == tiny.cfg.eos_id  # decoded, not cut to 1 token
    want = greedy(tiny, src, max_len_a=0.0, max_len_b=cap)  # the cap, by another rule
    assert torch.equal(out, want)
    found = search(tiny, src, DecodeOptions(beam=2, max_len_b=10**30))
    assert found[0] and found[0][0].score <= 0


def test_an_absurd_alpha_scores_without_overflowing(tiny):
    assert length_penalty(10, 1000.0) == float("inf")  # 2.5 ** 1000 overflows a float
    assert length_penalty(10, 0.6) == pytest.approx(((5 + 10) / 6) ** 0.6)
    found = beam_search(tiny, SRC, beam_size=2, alpha=1000.0)
    assert all(h for h in found)


def test_an_ensemble_stops_within_its_shortest_model(tiny):
    torch.manual_seed(1)
    short = Transformer(tiny_config(max_len=8)).eval()
    src = torch.tensor([[4, 5, 2]])
    for models in ([tiny, short], [short, tiny]):
        out = greedy(models, src, max_new_tokens=20)
        assert out.size(1) <= 8
        hyps = beam_search(models, src, beam_size=2, max_new_tokens=20)
        assert hyps[0] and all(len(h.tokens) < 8 for h in hyps[0])
    with pytest.raises(DecodeError, match="leave no room for EOS within max_len=8"):
        greedy([tiny, short], src, prefix=[[5] * 8])


@pytest.mark.parametrize(
    ("src", "message"),
    [
        (SRC[0], "src must be a \\[batch, length\\] tensor of token ids, got a 1-D tensor"),
        (SRC[None], "got a 3-D tensor"),
        ([[4, 5, 2]], "got list"),
        (None, "got NoneType"),
    ],
)
def test_src_must_be_a_batch_of_rows(tiny, src, message):
    for decode in (
        lambda: greedy(tiny, src),
        lambda: beam_search(tiny, src),
        lambda: search(tiny, src, DecodeOptions(beam=1)),
    ):
        with pytest.raises(DecodeError, match=message):
            decode()


def test_an_empty_source_decodes_as_a_source_of_padding(tiny):
    empty = torch.zeros(2, 0, dtype=torch.long)
    padding = torch.full((2, 1), tiny.cfg.pad_id)
    assert torch.equal(greedy(tiny, empty), greedy(tiny, padding))
    assert [h[0].tokens for h in beam_search(tiny, empty, beam_size=2)] == [
        h[0].tokens for h in beam_search(tiny, padding, beam_size=2)
    ]


@pytest.mark.parametrize(
    ("prefix", "message"),
    [
        (["ab", "cd"], "per sentence, a sequence of token ids"),
        ([[5.7], [6]], "per sentence, a sequence of token ids"),
        ([None, [6]], "per sentence, a sequence of token ids"),
        (5, "per sentence, a sequence of token ids"),
        ([[], [], []], "3 prefixes for 2 sentences"),
        ([[5]], "1 prefixes for 2 sentences"),
    ],
)
def test_malformed_prefixes_are_refused(tiny, prefix, message):
    with pytest.raises(DecodeError, match=message):
        greedy(tiny, SRC, prefix=prefix)


def test_prefixes_of_ids_in_any_integer_form_still_work(tiny):
    want = greedy(tiny, SRC, prefix=[[5, 6], [7]])
    assert torch.equal(greedy(tiny, SRC, prefix=[torch.tensor([5, 6]), (7,)]), want)
    assert torch.equal(greedy(tiny, SRC, prefix=[]), greedy(tiny, SRC))  # none given


def test_a_tensor_of_prefixes_is_a_prefix_per_row(tiny):
    """A [B, P] tensor met `prefix or []`: "Boolean value of a Tensor ... is ambiguous",
    and a 1 x 1 tensor holding 0 was taken for no prefix at all."""
    want = greedy(tiny, SRC, prefix=[[5, 6], [7, 8]])
    assert torch.equal(greedy(tiny, SRC, prefix=torch.tensor([[5, 6], [7, 8]])), want)
    with pytest.raises(DecodeError, match="EOS, PAD and BOS cannot be forced"):
        greedy(tiny, SRC[:1], prefix=torch.tensor([[tiny.cfg.pad_id]]))
    with pytest.raises(DecodeError, match="per sentence, a sequence of token ids"):
        greedy(tiny, SRC, prefix=torch.tensor([[5.0], [6.0]]))


def test_the_meta_device_holds_nothing_to_decode(tiny):
    """A src or a model on the meta device met torch's "Cannot copy out of meta tensor"
    inside the search."""
    for decode in (
        lambda m, src: greedy(m, src, max_new_tokens=4),
        lambda m, src: beam_search(m, src, beam_size=2),
    ):
        with pytest.raises(DecodeError, match="src is on the meta device, which holds no ids"):
            decode(tiny, SRC.to("meta"))
        with torch.device("meta"):
            ghost = Transformer(tiny_config())
        with pytest.raises(DecodeError, match="model 1 is on the meta device"):
            decode(ghost, SRC)


def test_memory_of_ids_is_not_an_encoder_output(tiny):
    with pytest.raises(ModelInputError, match="memory must be the encoder output \\(floats\\)"):
        tiny.decode(SRC[:, :1], torch.zeros(2, 4, tiny.cfg.d_model, dtype=torch.long), SRC)


def test_prefixes_and_a_prefix_for_every_line_are_not_both_taken(translator):
    """The prefix for every line was dropped silently when prefixes were given too."""
    with pytest.raises(AiaynError, match="give prefixes, one per line, or a prefix for every"):
        translator.translate(["Ein Hund."], prefixes=[""], prefix="Two", beam=1)


def test_what_is_not_a_model_is_named(tiny):
    for models, message in (
        (None, "no model to decode with"),
        ("model", "model 1 is a str, not a Transformer"),
        ([tiny, None], "model 2 is a NoneType, not a Transformer"),
    ):
        with pytest.raises(DecodeError, match=message):
            greedy(models, SRC)  # type: ignore[arg-type]


def test_generation_settings_of_the_wrong_type(sample_model_dir, tmp_path):
    for settings, message in (
        ({"num_beams": "abc"}, "generation settings: invalid literal"),
        ({"num_beams": 0}, "generation settings: beam must be an integer >= 1"),
        ({"do_sample": True, "temperature": "hot"}, "generation settings: could not convert"),
        ([1, 2], "generation settings: a mapping, not list"),
    ):
        with pytest.raises(DecodeError, match=message):
            DecodeOptions.from_generation(settings)  # type: ignore[arg-type]
    # A null is a setting left unset, as in transformers' GenerationConfig (the default).
    unset = {"do_sample": True, "temperature": None, "top_k": None, "num_beams": None}
    assert DecodeOptions.from_generation(unset) == DecodeOptions.from_generation(
        {"do_sample": True}
    )
    state = load_checkpoint(resolve_checkpoint(sample_model_dir()))
    path = save_checkpoint({**state, "generation": [1, 2]}, tmp_path / "g.pt")
    with pytest.raises(CheckpointError, match="checkpoint entry 'generation' is malformed"):
        load_checkpoint(path)


def test_plots_name_what_they_wrote_and_refuse_unknown_kinds(translator, tmp_path):
    amap = maps.attention(translator, "Ein Hund.", beam=1)
    written = plot_attention(amap, tmp_path / "plots")
    assert written == tmp_path / "plots.png" and written.is_file()
    with pytest.raises(AiaynError, match="cannot write"):
        plot_attention(amap, tmp_path / "heat.xyz")
    out = tmp_path / "all"
    for kinds in (["cross", "bogus"], "cross"):
        with pytest.raises(AiaynError, match="attention kind must be one of"):
            plot_all(amap, out, kinds=kinds)
    assert not out.exists()  # refused before the first file


def test_a_beam_larger_than_the_vocabulary_is_refused(tiny):
    vocab = tiny.cfg.tgt_vocab_size
    with pytest.raises(DecodeError, match=f"beam {vocab + 1} is larger than the target vocab"):
        beam_search(tiny, SRC, beam_size=vocab + 1)
    assert all(beam_search(tiny, SRC, beam_size=vocab))  # as many beams as tokens: fine


def test_quantize_must_be_a_bool_and_precision_a_known_name(sample_model_dir):
    model_dir = sample_model_dir()
    path = resolve_checkpoint(model_dir)
    loaders = (
        lambda **kw: load_model(path, **kw),
        lambda **kw: load_inference(path, **kw),
        lambda **kw: Translator.from_dir(model_dir, **kw),
    )
    for load in loaders:
        for bad in ("no", 1, None):  # "no" quantized: a truthy string
            with pytest.raises(AiaynError, match=r"quantize must be True or False, not an? "):
                load(quantize=bad)
        for bad in (["fp32"], None, "FP32"):  # a list was a TypeError (unhashable)
            with pytest.raises(AiaynError, match="precision must be one of fp32, bf16, got"):
                load(precision=bad)
    model, _ = load_model(path, quantize=False, precision="fp32")
    assert all(type(m) is not torch.ao.nn.quantized.dynamic.Linear for m in model.modules())


def test_max_len_has_an_upper_bound():
    # A billion positions asked torch for an 8 TB position table when the model was built.
    for bad in (10**9, MAX_POSITIONS + 1, 0):
        with pytest.raises(ConfigError, match=r"TransformerConfig.max_len: must be in \[1, 6"):
            tiny_config(max_len=bad)
    assert tiny_config(max_len=MAX_POSITIONS).max_len == MAX_POSITIONS


def test_a_decoder_needs_a_layer_an_encoder_does_not():
    """Zero decoder layers made a model whose output ignores the source (cross-attention is
    in the decoder's layers), and its continuous batch failed to join: "an empty
    DecoderState". Refused at the config; an encoder of no layers still works."""
    with pytest.raises(ConfigError, match=r"n_decoder_layers: must be >= 1 \(without a dec"):
        tiny_config(n_decoder_layers=0)
    with pytest.raises(ConfigError, match="n_encoder_layers: must be >= 0, got -1"):
        tiny_config(n_encoder_layers=-1)
    model = Transformer(tiny_config(n_encoder_layers=0)).eval()
    engine = BeamEngine(model, DecodeOptions(beam=1, max_len_b=4))
    engine.add(SRC[:1], ["a"])
    engine.step()
    engine.add(SRC[1:2], ["b"])  # joins the running batch
    while len(engine):
        engine.step()


def test_inputs_on_another_device_than_the_model_are_named(tiny):
    # The meta device stands in for a GPU: the CPU model met it in torch's own error.
    away = SRC.to("meta")
    with pytest.raises(ModelInputError, match="src is on device meta but the model is on cpu"):
        tiny.encode(away)
    with pytest.raises(ModelInputError, match="src is on device meta but the model is on cpu"):
        tiny(away, away)
    with pytest.raises(ModelInputError, match="tgt_in is on device meta but src is on cpu"):
        tiny(SRC, away)
    assert tiny(SRC, SRC).shape == (*SRC.shape, tiny.cfg.tgt_vocab_size)  # one device: fine


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m, mem: m.decode(SRC[:, :1], mem[..., :8], SRC), r"got \(2, 4, 8\)"),
        (lambda m, mem: m.decode(SRC[:, :1], [1, 2], SRC), "got list"),
        (lambda m, mem: m.decode(SRC[:, :1], mem, SRC.float()), "src must be torch.long"),
        (lambda m, mem: m.decode(SRC[:, :1], mem, SRC[0]), r"src must have shape \[batch"),
        (lambda m, mem: m.decode(SRC[:, :1], mem, SRC, "x"), "state must be a DecoderState"),
        (lambda m, mem: m.start_state(mem[0]), r"memory must be the encoder output \[batch"),
        (lambda m, mem: m.start_state(mem, 0), "group must be an integer >= 1"),
        (lambda m, mem: m.start_state(mem, "2"), "group must be an integer >= 1"),
    ],
)
def test_decode_and_start_state_name_a_bad_argument(tiny, call, message):
    """The incremental-decoding API's arguments, checked: each met a shape or dtype error
    inside torch (or an AttributeError), or was accepted (a float src, group 0)."""
    memory = tiny.encode(SRC)  # [2, 4, d_model]
    with pytest.raises(ModelInputError, match=message):
        call(tiny, memory)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda t: t.encode(None), "text: a str, not NoneType"),
        (lambda t: t.encode(["Ein", "Hund"]), "text: a str, not list"),  # was a batch
        (lambda t: t.encode("Ein \ud800"), r"text: not valid Unicode \(character 4\)"),
        (lambda t: t.encode_target(5), "text: a str, not int"),
        (lambda t: t.encode_batch("Ein Hund"), "texts: a list of str, not str"),  # letters
        (lambda t: t.encode_batch(["Ein", None]), r"texts\[1\]: a str, not NoneType"),
        (lambda t: t.encode_target_batch(["a", "\udc00"]), r"texts\[1\]: not valid Unicode"),
        (lambda t: t.decode([5, 6, 70000]), r"ids\[2\]: 70000 is outside the vocabulary \[0, "),
        (lambda t: t.decode([5, -1]), r"ids\[1\]: -1 is outside the vocabulary"),
        (lambda t: t.decode([5, 6.5]), r"ids\[1\]: 6.5 is not a token id \(an int\)"),
        (lambda t: t.decode("abc"), "ids: a sequence of token ids, not str"),
        (lambda t: t.decode(None), "ids: a sequence of token ids, not NoneType"),
        (lambda t: t.decode(torch.tensor([5, 70000])), r"ids\[1\]: 70000 is outside"),
        (lambda t: t.decode_batch([[5], [-3]]), r"ids\[0\]: -3 is outside the vocabulary"),
        (lambda t: t.id_to_piece(70000), r"id: 70000 is outside the vocabulary \[0, "),
        (lambda t: t.id_to_piece([5, 6]), r"id: \[5, 6\] is not a token id"),
        (lambda t: t.piece_to_id(["a"]), "piece: a str, not list"),
    ],
)
def test_tokenizer_inputs_are_named(translator, call, message):
    with pytest.raises(TokenizerError, match=message):
        call(translator.tokenizer)


def test_tokenizer_still_takes_ids_in_any_integer_form(translator):
    tok = translator.tokenizer
    ids = tok.encode("Ein Hund.")
    want = tok.decode(ids)
    assert want and tok.decode(torch.tensor(ids)) == want == tok.decode(tuple(ids))
    assert tok.decode([*ids, 2, 70000]) == want  # after EOS: ignored, as before
    assert tok.id_to_piece(torch.tensor(ids[0])) == tok.id_to_piece(ids[0])
    assert tok.encode_batch(("Ein Hund.",)) == [ids]


def test_engine_remove_refuses_a_str_of_tags(tiny):
    engine: BeamEngine[str] = BeamEngine(tiny, DecodeOptions(beam=2))
    engine.add(SRC, ["a", "b"])
    with pytest.raises(DecodeError, match="remove: tags must be a set of tags, not the str"):
        engine.remove("ab")  # type: ignore[arg-type]
    assert len(engine) == 2  # nothing dropped
    engine.remove({"a"})
    assert len(engine) == 1


def test_options_replace_names_an_unknown_field():
    options = DecodeOptions()
    with pytest.raises(DecodeError, match="DecodeOptions has no field beem"):
        options.replace(beem=3)
    with pytest.raises(DecodeError, match="DecodeOptions has no field beem"):
        options.given(beem=3, alpha=None)
    assert options.given(beam=3, alpha=None).beam == 3


def test_a_setting_given_replaces_the_rule_of_the_models_defaults(translator):
    """As the command line and the server do it: a keyword given to translate() replaces
    the rule it belongs to in an imported model's generation settings. It was refused:
    cut_at_limit against the folder's forced EOS, sampling=False against its top_k 50, and
    beam 4 against its sampling."""
    lines = ["Ein Mann fährt Fahrrad.", "Zwei Hunde."]
    model, tok = translator.model, translator.tokenizer
    opus = Translator(model, tok, {"num_beams": 4, "max_length": 64, "forced_eos_token_id": 2})
    cut = opus.options(None, {"cut_at_limit": True})
    assert cut.cut_at_limit and not cut.forced_eos and cut.beam == 4
    assert opus.translate(lines, cut_at_limit=True) == translator.translate(lines, cut.replace())
    sampler = Translator(model, tok, {"do_sample": True, "top_k": 50, "max_length": 64})
    searched = DecodeOptions(beam=1, alpha=1.0, length_penalty="hf", max_len_a=0.0,
                             max_len_b=63, cut_at_limit=True, early_stopping=False)  # fmt: skip
    assert sampler.options(None, {"sampling": False}) == searched
    assert sampler.options(None, {"beam": 4}) == searched.replace(beam=4)
    assert sampler.translate(lines, beam=4) == translator.translate(lines, searched.replace(beam=4))
    drawn = sampler.options(None, {"seed": 3})  # what is not given keeps the model's rule
    assert drawn.sampling and drawn.top_k == 50 and drawn.beam == 1
    # Its number of samples goes with sampling: at most the beam (it was "n_best 4 > beam").
    four = Translator(model, tok, {"do_sample": True, "num_return_sequences": 4})
    assert (four.options(None, {"beam": 2}).n_best, four.options(None, {"beam": 5}).n_best) == (
        2,
        4,
    )
    assert four.options(None, {"sampling": False}).n_best == 1
