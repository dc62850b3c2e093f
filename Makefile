# Two commands do all the set-up on a fresh machine:
#   make demo   -> virtualenv + install + `aiayn demo`
#   make test   -> virtualenv + install + the test suite + the documentation site
# On a machine without a GPU, take torch's CPU build (no gigabytes of CUDA libraries):
#   make TORCH_INDEX=https://download.pytorch.org/whl/cpu test
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
# Pinned; a pin alone does not pick the CPU build: TORCH_INDEX (a PyTorch wheel index, e.g.
# https://download.pytorch.org/whl/cpu or .../whl/cu128) does. Empty: pip's own indexes
# (PyPI's Linux wheel is the CUDA build).
TORCH  ?= torch==2.13.0
TORCH_INDEX ?=

.PHONY: setup demo test test-fresh lint typecheck docs bench bleu figures table3 clean browser \
	mutation

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

demo: setup
	$(BIN)/aiayn demo

# The browser test of the web page drives Debian's chromium through chromium-driver; as
# root (CI) they are installed here, else the test is skipped with a loud notice.
browser:
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver \
	      || echo "WARNING: apt-get could not install chromium: the browser test will be SKIPPED"; \
	  else \
	    echo "WARNING: no chromium/chromedriver and not root: the browser test will be SKIPPED"; \
	  fi; \
	fi

# What ruff checks and formats: the code and the scripts that draw the docs' figures.
LINTED = src tests benchmarks docs/figures docs/tools
# pytest-xdist workers: two test files at a time (a file's tests stay in one worker, so its
# fixtures are built once), each worker with its share of the cores (tests/conftest.py).
# Much of the suite waits on processes it starts (torchrun ranks, servers, their imports),
# so two workers finish in about 60% of one's time even on 2 cores. TEST_WORKERS=0 runs
# everything in one process (what a debugger wants).
TEST_WORKERS ?= 2
PYTEST = $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile
test: setup browser
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/mypy
	$(PYTEST)
	$(MAKE) docs

# The documentation site (mkdocs.yml) into site/: strict, so a broken link, a missing page
# or an API docstring that does not render fails `make test`. No network needed.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The tests that read Multi30k (marked multi30k) again, with the data hidden, as on a new
# user's clone with nothing beside it; .ci/run runs it after `make test`.
test-fresh: setup
	AIAYN_MULTI30K=none $(PYTEST) -m multi30k

# Types of src/aiayn, with the settings of pyproject.toml's [tool.mypy] (part of `make test`).
typecheck: setup
	$(BIN)/mypy

# Speed, peers side by side (torch.nn.Transformer, Marian, CTranslate2): bench_out/speed.md.
# Uses the de-en model of `make bleu` when it exists, else an untrained one (speed only).
CKPT = runs/bench-de-en/checkpoint_averaged.pt
bench: setup
	$(BIN)/pip install -q -e ".[bench]"
	$(BIN)/python -m benchmarks.speed --out bench_out $(if $(wildcard $(CKPT)),--checkpoint $(CKPT))

# Multi30k de-en: one hour of training on 2 CPU cores, then test2016 BLEU (BENCHMARKS.md).
bleu: setup
	$(BIN)/aiayn data get multi30k --pair de-en
	$(BIN)/python benchmarks/multi30k_bleu.py --pair de-en --out runs/bench-de-en

# Every picture of the guided tour (docs/figures/*.png). MODEL is a trained model directory
# (`aiayn train --config recipes/multi30k.yaml --out runs/de-en`) for the training curves and
# attention heatmaps, and the training_run.txt and attention_heads.txt the tour prints (then
# `AIAYN_TOUR_UPDATE=1 .venv/bin/python -m pytest tests/test_tour.py` updates the pages);
# without it those committed files are kept and the rest redrawn.
MODEL ?= runs/de-en
figures: setup
	$(BIN)/python docs/figures/make_figures.py --model $(MODEL)

# Table 3 of the paper in miniature on Multi30k de-en (BENCHMARKS.md): 14 rows x 300 updates.
table3: setup
	$(BIN)/python benchmarks/table3_mini.py --out runs/table3-mini

# Mutation score of the core modules (BENCHMARKS.md): mutmut over model/, train/loss.py,
# schedule.py and averaging.py, decode/, data/tokenizer.py and metrics/bleu.py, each with
# its fast tests (hours on 2 cores: `python benchmarks/mutation.py --out DIR MODULE` runs
# one; not part of `make test`). Results in bench_out/mutation/.
mutation: setup
	$(BIN)/python benchmarks/mutation.py --out bench_out/mutation

lint: setup
	$(BIN)/ruff check --fix $(LINTED)
	$(BIN)/ruff format $(LINTED)

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .ruff_cache .mypy_cache bench_out site
