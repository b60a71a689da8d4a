# Everything a fresh machine with only Python needs: `make run` and `make test`.
PY ?= python3
UV_VERSION ?= 0.13.9
TOOLS := .tools
UV := $(TOOLS)/bin/uv
VENV := .venv
HOST ?= 127.0.0.1
PORT ?= 8000

# Never download a Python: use the machine's (downloads fail on closed networks).
export UV_PYTHON_DOWNLOADS := never
export UV_PROJECT_ENVIRONMENT := $(VENV)

.PHONY: install run test lint typecheck unit format clean bench

$(UV):
	$(PY) -m venv $(TOOLS)
	$(TOOLS)/bin/pip install --quiet "uv==$(UV_VERSION)"

uv.lock: pyproject.toml | $(UV)
	$(UV) lock --python $(PY)

# Bytecode compiled once here: where PYTHONDONTWRITEBYTECODE is set (this CI's
# machines) Python never caches it, and every process (the server, each CLI
# command, each test's subprocess) compiled every module again: ~1.4 s a start.
$(VENV)/.installed: pyproject.toml uv.lock Makefile | $(UV)
	$(UV) sync --frozen --python $(PY) --compile-bytecode
	touch $@

# Our own modules too, each time (only those changed since are compiled again).
install: $(VENV)/.installed
	$(VENV)/bin/python -m compileall -q runtime server nodes graphs tools

run: install
	$(VENV)/bin/agent-runtime serve --host $(HOST) --port $(PORT)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy

test: lint typecheck
	$(VENV)/bin/pytest -q

unit: install
	$(VENV)/bin/pytest -q tests/unit

bench: install
	$(VENV)/bin/python -m bench.run

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) $(TOOLS) .agent-runtime .pytest_cache .mypy_cache .ruff_cache
