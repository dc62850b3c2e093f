# Two commands do all the set-up on a fresh machine:
#   make demo   -> virtualenv + install + `aiayn demo`
#   make test   -> virtualenv + install + the test suite
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
# Pinned: a looser requirement makes pip fetch GBs of CUDA wheels on a CPU machine.
TORCH  ?= torch==2.13.0

.PHONY: setup demo test lint bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

demo: setup
	$(BIN)/aiayn demo

test: setup
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/python -m pytest -q

lint: setup
	$(BIN)/ruff check --fix src tests benchmarks
	$(BIN)/ruff format src tests benchmarks

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .ruff_cache
