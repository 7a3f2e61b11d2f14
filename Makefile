# Two commands do everything on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# llama-cpp-python has no Linux wheel: pip compiles llama.cpp once (~15 min on 2 cores) and
# caches the wheel. These flags skip the parts we never use.
export CMAKE_ARGS ?= -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
export CMAKE_BUILD_PARALLEL_LEVEL ?= 2

.PHONY: run test lint bench clean-state docs

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, pinned: pip then takes the local CPU build instead of a CUDA download.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/slm-nightly run --profile local --summary .slm-nightly/last-summary.json

test: lint
	$(PY) -m pytest tests

lint: $(STAMP)
	$(VENV)/bin/ruff check flows tasks blocks tests bench examples
	$(VENV)/bin/mypy --ignore-missing-imports flows tasks blocks

# Every bench, one after the other; says which ran, which it skipped (and why: no GPU, say), and
# fails only when one failed. `make bench BENCH="scorecard_1m rerun_unchanged"` runs those only.
bench: $(STAMP)
	$(PY) bench/run_all.py $(BENCH)

# docs/reference.md from the code (CLI, profile keys, recipe keys); tests/unit/test_docs.py
# fails when it is stale.
docs: $(STAMP)
	$(PY) docs/generate.py

clean-state:
	rm -rf .slm-nightly
