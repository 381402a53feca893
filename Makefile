# BOute: every target sets up its own project-local virtualenv (.venv) on first use.
# torch is pinned to the CPU build by constraints.txt, so pip never pulls a multi-GB CUDA wheel here.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PIP     := $(BIN)/pip
export PIP_CONSTRAINT := $(CURDIR)/constraints.txt
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

# llama.cpp (the real CPU engine of backends/llamacpp) compiles for 15-40 min on 2 cores: `make engines`
# builds its wheel once into WHEELHOUSE; every later install takes it from there, and without it the
# llama.cpp tests skip (saying so) instead of rebuilding it inside `make test`.
WHEELHOUSE ?= $(HOME)/.cache/boute/wheels
LLAMA_CPP  := llama-cpp-python==0.3.36

.PHONY: install engines demo test test-fast bench lint format experiments clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt torch==2.13.0
	$(PIP) install -q -c constraints.txt -e '.[dev]'
	@if ls $(WHEELHOUSE)/llama_cpp_python-*.whl >/dev/null 2>&1; then \
	  $(PIP) install -q -c constraints.txt --find-links $(WHEELHOUSE) --only-binary llama-cpp-python -e '.[dev,engines]'; \
	else echo "note: no llama-cpp-python wheel in $(WHEELHOUSE); llama.cpp tests will skip (run 'make engines')"; fi
	touch $(STAMP)

## Build the llama.cpp engine once (cached in WHEELHOUSE) and install it.
engines: $(STAMP)
	@ls $(WHEELHOUSE)/llama_cpp_python-*.whl >/dev/null 2>&1 || \
	  CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF" nice $(PIP) wheel --no-deps -w $(WHEELHOUSE) '$(LLAMA_CPP)'
	$(PIP) install -q -c constraints.txt --find-links $(WHEELHOUSE) --only-binary llama-cpp-python -e '.[dev,engines]'

## Run the main job on the built-in example scenario: optimise routing + deployment, write the plan, confirm it.
demo: $(STAMP)
	@mkdir -p out
	$(BIN)/boute optimize --out out/plan.json --plot out/pareto.png --db sqlite:///out/boute.db
	$(BIN)/boute simulate --plan out/plan.json --json
	@echo "plan: out/plan.json  pareto plot: out/pareto.png  experiments: boute experiments list --db sqlite:///out/boute.db"

## The full test suite (starts an embedded redis-server when none answers on 127.0.0.1:6379).
test: $(STAMP)
	$(BIN)/python -m tests.services $(BIN)/pytest -q

test-fast: $(STAMP)
	$(BIN)/python -m tests.services $(BIN)/pytest -q -m "not slow" -x

## Benchmarks: results land in bench/results/*.json and bench/results/README.md.
bench: $(STAMP)
	$(BIN)/python -m bench

## Reproduce the paper's evaluation (results in experiments/results/); QUICK=1 for the minutes-long version.
experiments: $(STAMP)
	$(BIN)/python -m experiments $(if $(QUICK),--quick,)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
