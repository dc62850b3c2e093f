"""Mutation score of the core modules (issue 45): how many small code changes (mutants)
the test suite notices.

For each module, mutmut (a dev dependency, pinned in pyproject.toml) changes the code one
operator, constant or call at a time, and runs that module's fast subset of the tests
(below) against each change: a failing test kills the mutant, a passing suite lets it
survive. Each module runs in a folder of its own under ``--out`` (a copy of src/ and
tests/ with a pyproject.toml that configures mutmut for that module alone), so modules
and their test subsets do not mix and a run can be repeated or resumed module by module.

    python benchmarks/mutation.py --out bench_out/mutation            # every module
    python benchmarks/mutation.py --out bench_out/mutation masks      # one (or a few)

Not part of `make test` (`make mutation` runs it): hours on 2 cores. Writes
``--out/scores.json`` and ``--out/scores.md`` (per module: mutants, killed, survived,
score), and ``--out/NAME/survivors.txt`` (each surviving mutant's diff). The surviving
mutants judged equivalent (no test can kill them) are listed in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Module (under src/aiayn) -> the test files that exercise it, and the tests left out of
# them: those that train a model first (a fixture that takes seconds, which mutmut would
# rebuild for every mutant) and the CLI runs. Tests marked slow are left out as well.
TRAINS = "overfit or agrees_with_teacher or finds_better or presets or alignments or cli"
TRAINS += " or distillation or translator_of_no_model"
MODEL_TESTS = ["test_attention.py", "test_model.py", "test_layers.py", "test_embedding.py"]
DECODE_TESTS = [
    "test_decode.py",
    "test_decode_workflows.py",
    "test_decode_edges.py",
    "test_beam_bounds.py",
]
FAST_DECODE_TESTS = [t for t in DECODE_TESTS if t != "test_decode_workflows.py"]
MODULES: dict[str, tuple[str, list[str]]] = {
    "masks": ("model/masks.py", MODEL_TESTS),
    "attention": ("model/attention.py", [*MODEL_TESTS, "test_decode.py", "test_decode_edges.py"]),
    "layers": ("model/layers.py", [*MODEL_TESTS, "test_decode.py", "test_decode_edges.py"]),
    "embedding": ("model/embedding.py", MODEL_TESTS),
    # The decoder's key/value cache, out of attention.py and transformer.py since issue 41.
    "cache": (
        "model/cache.py",
        [*MODEL_TESTS, "test_decode.py", "test_decode_edges.py", "test_continuous.py"],
    ),
    "transformer": (
        "model/transformer.py",
        [*MODEL_TESTS, "test_decode.py", "test_decode_edges.py", "test_continuous.py"],
    ),
    "loss": ("train/loss.py", ["test_train_parts.py"]),
    "schedule": ("train/schedule.py", ["test_train_parts.py"]),
    # Since issue 41 one engine runs every search (decode/engine.py; greedy.py is gone) and
    # beam.py holds beam search's rules.
    "beam": ("decode/beam.py", [*DECODE_TESTS, "test_engine_units.py"]),
    "engine": (
        "decode/engine.py",
        [*DECODE_TESTS, "test_continuous.py", "test_engine_units.py", "test_sampling.py"],
    ),
    "bleu": ("metrics/bleu.py", ["test_bleu.py"]),
    # Sampling's distribution and draws, the options every search takes and what the
    # searches share (length rule, bans, prefixes, the decode step).
    "sampling": (
        "decode/sampling.py",
        [
            "test_sampling.py",
            "test_sampling_draws.py",
            "test_engine_units.py",
            "test_decode_workflows.py",
        ],
    ),
    # Without test_decode_workflows.py and test_sampling.py, whose tests of a trained
    # model (a fixture built again for every mutant) would take options and core past half
    # an hour each on 2 cores; and without the tests of test_library_refusals.py and
    # test_decode_edges.py that load the sample model (KEEP_OUT below).
    "options": (
        "decode/options.py",
        [
            *FAST_DECODE_TESTS,
            "test_engine_units.py",
            "test_library_refusals.py",
            "test_options_and_core.py",
        ],
    ),
    "core": (
        "decode/core.py",
        [
            *FAST_DECODE_TESTS,
            "test_engine_units.py",
            "test_continuous.py",
            "test_library_refusals.py",
            "test_options_and_core.py",
        ],
    ),
    "projection": (
        "model/projection.py",
        ["test_model.py", "test_decode.py", "test_model_inputs_and_cpu.py"],
    ),
    "inputs": (
        "model/inputs.py",
        [
            *MODEL_TESTS,
            "test_input_refusals.py",
            "test_library_refusals.py",
            "test_continuous.py",
            "test_model_inputs_and_cpu.py",
        ],
    ),
    "tokenizer": (
        "data/tokenizer.py",
        ["test_data.py", "test_tokenizer.py", "test_input_refusals.py", "test_marian_tokenizer.py"],
    ),
    "averaging": (
        "train/averaging.py",
        ["test_checkpoint.py", "test_averaging.py", "test_input_refusals.py"],
    ),
}

# Tests of options and core that load the trained sample model (sample_model_dir, through
# test_library_refusals.py's translator fixture or directly): left out of those two
# modules' runs, which would otherwise train it again for every mutant.
SAMPLE_MODEL = (
    "batch_size_below_1 or translator_inputs_must or prefix_the_vocabulary_cannot"
    " or long_prefix_with_an_unknown or built_for_another_tokenizer or wrong_arguments_are_one"
    " or attention_of_a_sentence"
    " or prefixes_and_a_prefix or generation_settings_of_the_wrong or plots_name_what"
    " or quantize_must_be or tokenizer_inputs_are_named or tokenizer_still_takes"
    " or setting_given_replaces or source_of_max_len_tokens"
)
KEEP_OUT = {"options": SAMPLE_MODEL, "core": SAMPLE_MODEL}  # module -> more tests left out

STATUS = {1: "killed", 3: "killed", 36: "timeout", 24: "timeout", -24: "timeout", 0: "survived"}
STATUS.update({5: "no tests", 33: "no tests"})  # code no test of the subset runs: not killed


def prepare(work: Path, module: str, tests: list[str], tests_rev: str | None = None) -> None:
    """A folder with src/ and tests/ copied (tests/ as of git revision ``tests_rev``, for
    a score before a change of the tests) and mutmut configured for ``module``."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("src", "tests"):
        if (work / name).exists():
            shutil.rmtree(work / name)
    shutil.copytree(ROOT / "src", work / "src", ignore=ignore)
    if tests_rev is None:
        shutil.copytree(ROOT / "tests", work / "tests", ignore=ignore)
    else:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", tests_rev, "tests"], capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)
    present = [t for t in tests if (work / "tests" / t).is_file()]  # an older tests/ may lack some
    selection = ", ".join(json.dumps(f"tests/{t}") for t in present)
    name = next((n for n, (m, _) in MODULES.items() if m == module), "")
    keep_out = f"{TRAINS} or {KEEP_OUT[name]}" if name in KEEP_OUT else TRAINS
    (work / "pyproject.toml").write_text(
        f"""[tool.mutmut]
source_paths = ["src"]
only_mutate = ["src/aiayn/{module}"]
pytest_add_cli_args_test_selection = [{selection}]
pytest_add_cli_args = [
    "-q", "-x", "-m", "not slow", "-k", "not ({keep_out})", "-p", "no:cacheprovider"
]
mutate_only_covered_lines = false

[tool.pytest.ini_options]
testpaths = ["tests"]
markers = ["slow: end-to-end", "multi30k: reads Multi30k"]
filterwarnings = [
    "ignore:Recommended. pip install sacremoses:UserWarning",
    "ignore:The PyTorch API of nested tensors:UserWarning",
    "ignore:enable_nested_tensor is True:UserWarning",
]
""",
        encoding="utf-8",
    )


def tally(work: Path, module: str) -> dict[str, int]:
    meta = work / "mutants" / "src" / "aiayn" / f"{module}.meta"
    codes = json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"]
    counts: dict[str, int] = {}
    for code in codes.values():
        status = STATUS.get(code, "not run" if code is None else f"other({code})")
        counts[status] = counts.get(status, 0) + 1
    counts["mutants"] = len(codes)
    return counts


def score(counts: dict[str, int]) -> float:
    """Killed (a test failed, or it ran past the time limit) in percent of the mutants
    decided; a mutant in code that no test of the subset runs counts as not killed."""
    killed = counts.get("killed", 0) + counts.get("timeout", 0)
    missed = counts.get("survived", 0) + counts.get("no tests", 0)
    return round(100 * killed / max(killed + missed, 1), 1)


def survivors(work: Path, env: dict[str, str]) -> str:
    """Each surviving mutant's diff (``mutmut show``)."""
    listed = subprocess.run(
        [sys.executable, "-m", "mutmut", "results"],
        cwd=work, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    lines = listed.stdout.splitlines()
    names = [line.split(":")[0].strip() for line in lines if ": survived" in line]
    out = []
    for name in names:
        shown = subprocess.run(
            [sys.executable, "-m", "mutmut", "show", name],
            cwd=work, env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        out.append(shown.stdout)
    return "\n".join(out)


def run(name: str, out: Path, jobs: int, tests_rev: str | None = None) -> dict:
    module, tests = MODULES[name]
    work = out / name
    work.mkdir(parents=True, exist_ok=True)
    if (work / "mutants").exists():
        shutil.rmtree(work / "mutants")
    prepare(work, module, tests, tests_rev)
    # The copied src/ must be what the tests import: not the checkout's (PYTHONPATH) nor
    # an editable install's; mutmut puts mutants/src first on the path.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AIAYN_MULTI30K": "none"}
    env.pop("PYTHONPATH", None)
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "mutmut", "run", "--max-children", str(jobs)],
        cwd=work, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    (work / "mutmut.log").write_text(done.stdout + done.stderr, encoding="utf-8")
    counts = tally(work, module)
    counts["seconds"] = round(time.monotonic() - start)
    (work / "survivors.txt").write_text(survivors(work, env), encoding="utf-8")
    counts["score"] = score(counts)
    return {"module": module, "tests": tests, "tests_rev": tests_rev, **counts}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help=f"modules (default all): {', '.join(MODULES)}")
    parser.add_argument("--out", type=Path, default=ROOT / "bench_out" / "mutation")
    parser.add_argument("--jobs", type=int, default=2, help="mutants tested at once")
    parser.add_argument(
        "--tests-rev", help="take tests/ from this git revision (a score before a change)"
    )
    parser.add_argument(
        "--rescore", action="store_true", help="count again what --out holds; run nothing"
    )
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in MODULES]
    if unknown:
        parser.error(f"unknown module(s) {', '.join(unknown)}; choose from {', '.join(MODULES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "scores.json"
    scores = json.loads(path.read_text()) if path.exists() else {}
    for name in args.names or list(MODULES):
        if args.rescore:
            if name in scores:
                scores[name].update(tally(args.out / name, MODULES[name][0]))
                path.write_text(json.dumps(scores, indent=1) + "\n")
            continue
        scores[name] = run(name, args.out, args.jobs, args.tests_rev)
        print(json.dumps({name: scores[name]}), flush=True)
        path.write_text(json.dumps(scores, indent=1) + "\n")
    lines = ["| module | mutants | killed | timeout | survived | no tests | score | seconds |"]
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    for s in scores.values():
        s["score"] = score(s)
        lines.append(
            f"| {s['module']} | {s['mutants']} | {s.get('killed', 0)} | {s.get('timeout', 0)} "
            f"| {s.get('survived', 0)} | {s.get('no tests', 0)} | {s['score']}% | {s['seconds']} |"
        )
    (args.out / "scores.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
