# The two commands of README.md:
#   make run    install everything, run the sidecar on ./data (unix:data/ckpt.sock and 127.0.0.1:50051)
#   make test   install everything (a Python venv, pinned npm tools), lint, run the tests (.ci/run calls it)
# Others: make bench (opt-in benchmarks), make report (regenerate bench/REPORT.md), make bench-scale (1M sessions),
#         make stubs (regenerate ckpt/v1 from proto/), make lint.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test bench report bench-scale stubs lint install

$(STAMP): pyproject.toml package.json clients/node/package.json
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	npm install --no-audit --no-fund --loglevel=error  # buf is pinned exactly in package.json
	npm install --no-audit --no-fund --loglevel=error --prefix clients/node
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	npx buf lint
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

# pytest exits 5 when it collects no tests; that is not a failure of the code. One worker per core, each
# test module on one worker (--dist loadscope): a module's sidecar fixture starts once, not once a worker.
test: lint
	$(PY) -m pytest -q -n auto --dist loadscope --durations=25 || [ $$? -eq 5 ]

# The scale benchmark at 100,000 sessions here (set CKPT_BENCH_SESSIONS to change it); 1M is make bench-scale.
bench: $(STAMP)
	CKPT_BENCH_SESSIONS=$${CKPT_BENCH_SESSIONS:-100000} $(PY) -m pytest -q -m benchmark -s -o timeout=0 tests/bench/

report: $(STAMP)
	$(VENV)/bin/ckpt bench run --out bench

bench-scale: $(STAMP)
	$(VENV)/bin/ckpt bench scale --sessions 1000000

stubs: $(STAMP)
	$(PY) scripts/gen_stubs.py

run: $(STAMP)
	$(VENV)/bin/ckpt serve --data-dir data --listen unix:data/ckpt.sock --listen 127.0.0.1:50051
