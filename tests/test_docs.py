"""The README and the documentation site agree with the code.

- every `aiayn ...` command line in README.md and docs/**/*.md (the tour aside: its own
  test runs its pages) names a real subcommand and real flags, with valid values; the
  command lines of code blocks parse with the real parser, required arguments included;
- the short ones run (`aiayn --version`, `aiayn data list`, `aiayn summary`);
- the CLI page lists every flag of every subcommand, and the recipe page every field of
  Recipe, as docs/tools/reference.py generates them from the code.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from aiayn import __version__
from aiayn.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [
    ROOT / "README.md",
    *sorted(p for p in DOCS.rglob("*.md") if DOCS / "tour" not in p.parents),
]


def _reference():
    spec = importlib.util.spec_from_file_location("docs_reference", DOCS / "tools" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


reference = _reference()


# -- finding the command lines ------------------------------------------------------------------
@dataclass
class Command:
    where: str  # file:line
    args: list[str]  # after `aiayn`
    whole: bool  # from a code block: a complete command, parsed with the real parser


FENCE = re.compile(r"^\s*```(\w*)")
INLINE = re.compile(r"`(aiayn [^`]+)`")
SEPARATORS = {";", "|", "&&", "||", "&", "(", ")"}
REDIRECTS = {">", ">>", "<", "2>", "2>&1"}
KEYWORDS = {"do", "then", "done", "fi", "else"}


def _words(line: str) -> list[str]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return list(lexer)


def _inline_words(text: str) -> list[str]:
    """The words of a command quoted in prose, where `a|b` means either (not a pipe)."""
    return shlex.split(text.replace("[", " ").replace("]", " "))


def _expand(word: str, variables: dict[str, str]) -> list[str]:
    whole = re.fullmatch(r"\$\{?(\w+)\}?", word)
    if whole and whole.group(1) in variables:  # unquoted: split into words, as a shell does
        return variables[whole.group(1)].split()
    return [re.sub(r"\$\{?(\w+)\}?", lambda m: variables.get(m.group(1), m.group(0)), word)]


def shell_commands(block: str) -> list[tuple[int, list[str]]]:
    """(line offset, words) of every simple command of a shell block whose program is
    `aiayn` (or `torchrun ... -m aiayn`), with the block's variables (NAME=value, and a
    `for` loop's first value) substituted."""
    variables: dict[str, str] = {}
    found = []
    lines = block.split("\n")
    i = 0
    while i < len(lines):
        start, line = i, lines[i]
        while line.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line.rstrip()[:-1] + " " + lines[i]
        i += 1
        words = _words(line.replace("[", " ").replace("]", " "))  # [--optional flags]
        command: list[str] = []
        for word in [*words, ";"]:
            if word not in SEPARATORS:
                command.append(word)
                continue
            while command and command[0] in KEYWORDS:
                command.pop(0)
            if command[:1] == ["for"] and len(command) >= 4:
                variables[command[1]] = command[3]
            elif command and all(re.match(r"[A-Za-z_]\w*=", w) for w in command):
                for w in command:
                    name, _, value = w.partition("=")
                    variables[name] = value
            else:
                args = [a for w in command for a in _expand(w, variables)]
                args = _drop_redirects(args)
                if args[:1] == ["torchrun"] and "aiayn" in args:
                    at = args.index("aiayn")
                    if args[at - 1] == "-m":
                        found.append((start, args[at + 1 :]))
                elif args[:1] == ["aiayn"]:
                    found.append((start, args[1:]))
            command = []
    return found


def _drop_redirects(args: list[str]) -> list[str]:
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in REDIRECTS:
            skip = True
        else:
            out.append(a)
    return out


def page_commands(page: Path) -> list[Command]:
    rel = page.relative_to(ROOT)
    found = []
    lines = page.read_text(encoding="utf-8").split("\n")
    fence, block, block_start = None, [], 0
    for n, line in enumerate(lines, 1):
        m = FENCE.match(line)
        if m and fence is None:
            fence, block, block_start = m.group(1), [], n + 1
            continue
        if m and fence is not None:
            if fence in ("bash", "sh", "shell", "console"):
                for offset, args in shell_commands("\n".join(block)):
                    found.append(Command(f"{rel}:{block_start + offset}", args, True))
            fence = None
            continue
        if fence is not None:
            block.append(line)
            continue
        for text in INLINE.findall(line):
            found.append(Command(f"{rel}:{n}", _inline_words(text)[1:], False))
    return found


ALL = [c for page in PAGES for c in page_commands(page)]


# -- checking them --------------------------------------------------------------------------
def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def problems(args: list[str], whole: bool) -> list[str]:
    """What is wrong with `aiayn ARGS`: an unknown subcommand, an unknown or abbreviated
    flag, a flag without its value, a value outside the flag's choices or type; for a whole
    command line, whatever else the real parser refuses (a missing required argument)."""
    parser, path, rest = build_parser(), ["aiayn"], list(args)
    while rest and _subparsers(parser) and not rest[0].startswith("-"):
        name = rest.pop(0)
        choices = _subparsers(parser)
        if name not in choices:
            return [f"{' '.join(path)}: no subcommand {name!r} (has {', '.join(choices)})"]
        parser, path = choices[name], [*path, name]
    options = parser._option_string_actions
    bad = []
    while rest:
        word = rest.pop(0)
        if not word.startswith("-") or word == "-":
            continue  # a positional argument (a file, a sentence)
        flag, has_value, value = word.partition("=")
        action = options.get(flag)
        if action is None:
            bad.append(f"{' '.join(path)}: no flag {flag}")
            continue
        if action.nargs == 0 or isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        values = [value] if has_value else []
        if not values and action.nargs in (None, 1):
            if not rest or (rest[0].startswith("-") and not _number(rest[0])):
                if whole:  # prose may name a flag alone: `aiayn train --data`
                    bad.append(f"{' '.join(path)}: {flag} needs a value")
                continue
            values = [rest.pop(0)]
        elif not values and action.nargs in ("?", "*"):
            while rest and not (rest[0].startswith("-") and not _number(rest[0])):
                values.append(rest.pop(0))
                if action.nargs == "?":
                    break
        for v in values:
            bad += _check_value(path, flag, action, v)
    if whole and not bad:
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
                build_parser().parse_args(args)
        except SystemExit as e:
            if e.code:
                bad.append(stderr.getvalue().strip().splitlines()[-1])
    return bad


def _number(word: str) -> bool:
    return re.fullmatch(r"-\d+(\.\d+)?", word) is not None


def _check_value(path: list[str], flag: str, action: argparse.Action, value: str) -> list[str]:
    if "$" in value:  # a shell variable the page leaves to the reader
        return []
    alternatives = value.split("|") if action.choices else [value]  # `--x a|b` in prose
    bad = []
    for v in alternatives:
        try:
            converted = action.type(v) if callable(action.type) else v
        except (ValueError, TypeError, argparse.ArgumentTypeError):
            bad.append(f"{' '.join(path)}: {flag} {v!r} is not a valid value")
            continue
        if action.choices is not None and converted not in action.choices:
            bad.append(f"{' '.join(path)}: {flag} {v!r} is not one of {list(action.choices)}")
    return bad


def test_the_command_finder_finds_them():
    block = """D=~/data   # a comment
L="--max-len-a 1.2 --max-len-b 10"
echo "Ein Hund." | aiayn translate --model runs/x --beam 4 > out.txt
for a in 0.6 1.0; do
  aiayn evaluate --model runs/x --alpha $a $L \\
      --src $D/val.de --ref $D/val.en; done
torchrun --standalone --nproc-per-node 4 -m aiayn translate --model m big.de -o big.en
zcat a.gz | cat - b > c"""
    found = shell_commands(block)
    assert [args for _, args in found] == [
        ["translate", "--model", "runs/x", "--beam", "4"],
        ["evaluate", "--model", "runs/x", "--alpha", "0.6", "--max-len-a", "1.2",
         "--max-len-b", "10", "--src", "~/data/val.de", "--ref", "~/data/val.en"],
        ["translate", "--model", "m", "big.de", "-o", "big.en"],
    ]  # fmt: skip
    assert [offset for offset, _ in found] == [2, 4, 6]
    assert len(ALL) > 60, f"only {len(ALL)} command lines found in the README and docs"
    assert any(c.where.startswith("README.md") for c in ALL)


@pytest.mark.parametrize(
    ("line", "whole", "wrong"),
    [
        ("aiayn tranzlate --model m", True, "no subcommand 'tranzlate'"),
        ("aiayn translate --model m --early-stop never", True, "no flag --early-stop"),
        ("aiayn translate --model m --max-new-tokens 20", True, "no flag --max-new-tokens"),
        ("aiayn translate --model m --beam four", True, "--beam 'four' is not a valid value"),
        ("aiayn translate --model m --length-penalty gnmt|len", False, "not one of"),
        ("aiayn translate --model", True, "--model needs a value"),
        ("aiayn evaluate --model m --src s", True, "required"),
        ("aiayn data fetch multi30k", False, "no subcommand 'fetch'"),
    ],
)
def test_the_check_finds_what_is_wrong(line, whole, wrong):
    found = problems(_inline_words(line)[1:], whole)
    assert any(wrong in p for p in found), found


@pytest.mark.parametrize("command", ALL, ids=lambda c: f"{c.where} {' '.join(c.args)[:60]}")
def test_every_documented_command_parses(command):
    assert problems(command.args, command.whole) == [], command.where


# -- the short ones run ------------------------------------------------------------------------
SHORT = {("--version",), ("data", "list"), ("summary",)}


def _short(command: Command) -> bool:
    head = tuple(command.args[:2]) if command.args[:1] == ["data"] else tuple(command.args[:1])
    return command.whole and head in SHORT and "--model" not in command.args


def test_the_short_commands_run(tmp_path, monkeypatch):
    monkeypatch.setenv("AIAYN_DATA", str(tmp_path / "cache"))
    short = {tuple(c.args) for c in ALL if _short(c)}
    assert ("--version",) in short and ("data", "list") in short
    for args in sorted(short):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                code = main(list(args))
            except SystemExit as e:  # --version exits 0 after printing
                code = e.code
        assert code in (0, None), f"aiayn {' '.join(args)} exited {code}"
        assert out.getvalue().strip(), f"aiayn {' '.join(args)} printed nothing"
        if args == ("--version",):
            assert out.getvalue().strip() == f"aiayn {__version__}"


# -- the generated pages ---------------------------------------------------------------------
def _page_flags(page: str) -> dict[str, set[str]]:
    """Per `## \\`aiayn ...\\`` section of the CLI page, the flags its table names."""
    sections: dict[str, set[str]] = {}
    current = None
    for line in page.split("\n"):
        heading = re.match(r"## `(aiayn[^`]*)`", line)
        if heading:
            current = heading.group(1)
            sections[current] = set()
        elif current and line.startswith("| `"):
            first_cell = line.split(" | ")[0]
            sections[current] |= set(re.findall(r"`(-[-\w]+)", first_cell))
    return sections


def test_the_cli_page_lists_every_flag_of_every_subcommand():
    listed = _page_flags((DOCS / "cli.md").read_text(encoding="utf-8"))
    for path, parser, _ in reference.leaf_commands(build_parser()):
        name = " ".join(["aiayn", *path])
        assert name in listed, f"docs/cli.md has no section for `{name}`"
        assert listed[name] == set(reference.flags(parser)), (
            f"`{name}`: the parser and docs/cli.md differ; run python docs/tools/reference.py"
        )
    assert reference.generated_part(DOCS / "cli.md") == reference.cli_markdown(), (
        "docs/cli.md is stale (help texts or defaults changed): run python docs/tools/reference.py"
    )


def test_the_recipe_page_lists_every_field():
    from dataclasses import fields

    from aiayn.train.recipe import Recipe

    page = reference.generated_part(DOCS / "recipe.md")
    for f in fields(Recipe):
        if f.name != "given_model_fields":
            assert f"| `{f.name}` |" in page, f"docs/recipe.md lacks the field {f.name}"
    assert page == reference.recipe_markdown(), (
        "docs/recipe.md is stale (a field, default or comment changed): "
        "run python docs/tools/reference.py"
    )


def test_the_recipe_page_says_which_model_defaults_a_recipe_gets():
    """The `model:` table lists TransformerConfig's defaults; a recipe that leaves a model
    field out gets MODEL_DEFAULTS, which differ (share_embeddings true, not false; max_len
    256, not 1024): the page's own text says what a recipe gets."""
    from dataclasses import fields

    from aiayn.config import TransformerConfig
    from aiayn.train.recipe import MODEL_DEFAULTS

    page = (DOCS / "recipe.md").read_text(encoding="utf-8")
    hand_written = page.replace(reference.generated_part(DOCS / "recipe.md"), "")
    config = {f.name: f.default for f in fields(TransformerConfig)}
    differ = {k: v for k, v in MODEL_DEFAULTS.items() if v != config[k]}
    assert differ, "MODEL_DEFAULTS agrees with TransformerConfig: this test checks nothing"
    for key, value in differ.items():
        shown = str(value).lower() if isinstance(value, bool) else str(value)
        assert f"`{key}: {shown}`" in hand_written, f"docs/recipe.md: say a recipe gets {key}"


def test_the_readme_is_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 160, f"README.md has {lines} lines; the rest belongs on the docs pages"


def test_the_readme_links_exist():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    assert len(targets) > 20
    missing = [
        t
        for t in targets
        if "://" not in t and not t.startswith("#") and not (ROOT / t.split("#")[0]).exists()
    ]
    assert missing == [], f"README.md links files that do not exist: {missing}"


def _python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.DOTALL)


@pytest.mark.parametrize("page", ["README.md", "docs/python-api.md"])
def test_the_translator_example_runs(page, sample_model_dir):
    """The text-in, text-out example, on a small trained model directory in place of the
    page's model: it runs, and gives one list of outputs per input line."""
    block = next(b for b in _python_blocks(ROOT / page) if "Translator.from_dir" in b)
    path = re.search(r'Translator\.from_dir\("([^"]+)"\)', block)
    assert path is not None, f"{page}: the example loads no model directory"
    namespace: dict = {}
    exec(block.replace(path.group(1), str(sample_model_dir())), namespace)
    out = namespace["translator"].translate(["Ein Hund rennt über die Wiese.", ""])
    assert len(out) == 2 and all(isinstance(o, list) and len(o) == 1 for o in out)
    assert out[1] == [""] and isinstance(out[0][0], str)
