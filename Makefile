# Every target works on a fresh machine: it creates .venv and installs what it needs.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv demo test lint bench diagrams clean fuzz

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m fsm_agent demo --scenario all --trace-dir traces

test: $(STAMP)
	$(PY) -m pytest --fsm-coverage --fsm-coverage-fail-under=100

# Long property-based run of the run invariants: FUZZ_EXAMPLES examples split over
# FUZZ_WORKERS processes; prints examples/s and whether any invariant broke.
FUZZ_EXAMPLES ?= 50000
FUZZ_WORKERS  ?= 2
fuzz: $(STAMP)
	$(PY) benchmarks/fuzz.py --examples $(FUZZ_EXAMPLES) --workers $(FUZZ_WORKERS)

lint: $(STAMP)
	$(PY) -m ruff check fsm_agent tests benchmarks
	$(PY) -m mypy

bench: $(STAMP)
	$(PY) benchmarks/overhead.py

clean:
	rm -rf $(VENV) traces .pytest_cache .mypy_cache .ruff_cache
