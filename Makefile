# Every target works on a fresh machine: it creates .venv and installs what it needs.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv demo test test-fast lint bench diagrams clean fuzz docs dist screenshots mcp-servers

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,otel-compare]'
	touch $(STAMP)

venv: $(STAMP)

# Writes only git-ignored files (traces/); the committed pictures change through `make diagrams`.
demo: $(STAMP)
	$(PY) -m fsm_agent demo --scenario all --trace-dir traces --db traces/demo.db
	$(PY) -m fsm_agent replay traces/retry.jsonl --html traces/retry.html
	@echo "open traces/retry.html in a browser to step through the retry scenario"

# Published MCP servers for tests/test_mcp_real_servers.py (PyPI and npm; never fails:
# a server that cannot be installed makes its tests skip with the reason).
mcp-servers: $(STAMP)
	$(PY) tests/mcp_servers.py

test: $(STAMP) mcp-servers
	$(PY) -m pytest --fsm-coverage --fsm-coverage-fail-under=100

# The fast tier: the per-edge suite driven by hand through the sans-I/O loop, under the
# determinism trap of tests/core/ (no driver, thread, clock or file; milliseconds each).
test-fast: $(STAMP)
	$(PY) -m pytest -m fast tests/core

# Long property-based run of the run invariants: FUZZ_EXAMPLES examples split over
# FUZZ_WORKERS processes; prints examples/s and whether any invariant broke.
FUZZ_EXAMPLES ?= 50000
FUZZ_WORKERS  ?= 2
fuzz: $(STAMP)
	$(PY) benchmarks/fuzz.py --examples $(FUZZ_EXAMPLES) --workers $(FUZZ_WORKERS)

lint: $(STAMP)
	$(PY) -m ruff check fsm_agent tests benchmarks examples scripts docs/_hooks
	$(PY) -m ruff format --check fsm_agent tests benchmarks examples scripts docs/_hooks
	$(PY) -m mypy

bench: $(STAMP)
	$(PY) benchmarks/overhead.py
	$(PY) benchmarks/durable.py
	$(PY) benchmarks/check_speed.py
	$(PY) benchmarks/check_vs_walker.py
	$(PY) benchmarks/replay_frame.py
	$(PY) benchmarks/otel.py
	$(PY) benchmarks/rules.py
	$(PY) benchmarks/streaming.py
	$(PY) -m pip install -q -e '.[bench-langgraph]'
	$(PY) benchmarks/postgres.py
	$(PY) benchmarks/pg_network.py

# The machine picture from the table, and one replay frame per demo scenario.
DIAGRAM_TRACES := build/diagram-traces
diagrams: $(STAMP)
	rm -rf $(DIAGRAM_TRACES)
	$(PY) -m fsm_agent demo --scenario all --trace-dir $(DIAGRAM_TRACES) > /dev/null
	$(PY) -m fsm_agent check --quiet $(DIAGRAM_TRACES)/*.jsonl
	$(PY) -m fsm_agent._cli.regen $(DIAGRAM_TRACES) diagrams docs

# The documentation site (MkDocs Material + mkdocstrings) into site/; warnings are errors.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

# The wheel and sdist into dist/, checked by twine (what a release uploads).
dist: $(STAMP)
	rm -rf dist
	$(PY) -m build --outdir dist
	$(PY) -m twine check --strict dist/*

# The pictures of docs/assets/ a reader looks at: the README picture at 900 px, the viewer at
# its default zoom, the demo's output (headless Debian chromium via Playwright).
screenshots: $(STAMP)
	$(PY) scripts/screenshots.py docs/assets

clean:
	rm -rf $(VENV) traces site dist .pytest_cache .mypy_cache .ruff_cache

# Provider adapters: translation + validation cost per model call, next to a loopback SDK call.
.PHONY: bench-adapters test-adapters
bench: bench-adapters
bench-adapters: $(STAMP)
	$(PY) benchmarks/adapters.py

test-adapters: $(STAMP)
	$(PY) -m pytest tests/test_model_adapters.py tests/test_model_cli.py \
		tests/test_provider_validators.py tests/test_tools_mcp.py tests/test_examples_providers.py \
		tests/test_readme_models.py tests/test_provider_corpus.py tests/test_provider_fidelity.py \
		tests/test_model_pricing.py tests/test_mcp_real_servers.py
