# `make test` installs everything (a Python venv, pinned npm tools such as buf)
# then lints and runs the tests; it is what README.md and .ci/run call. Others: make bench (opt-in benchmarks), make stubs (regenerate ckpt/v1 from proto/), make lint.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test bench stubs lint install

$(STAMP): pyproject.toml package.json package-lock.json
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	npm install --no-audit --no-fund --loglevel=error  # buf is pinned exactly in package.json
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	npx buf lint
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

# pytest exits 5 when it collects no tests; that is not a failure of the code.
test: lint
	$(PY) -m pytest -q || [ $$? -eq 5 ]

bench: $(STAMP)
	$(PY) -m pytest -q -m benchmark -s bench/

stubs: $(STAMP)
	$(PY) scripts/gen_stubs.py
