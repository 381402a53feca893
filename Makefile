# BOute: every target sets up its own project-local virtualenv (.venv) on first use.
# constraints.txt pins every package to the version the suite was tested with (`make lock` regenerates it);
# torch is installed first, from it, so pip never pulls a multi-GB CUDA wheel here.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PIP     := $(BIN)/pip
export PIP_CONSTRAINT := $(CURDIR)/constraints.txt
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

# llama.cpp (the real CPU engine of backends/llamacpp) is compiled from source: only the libraries the
# Python binding loads. The CPU instruction sets are chosen deliberately, not with GGML_NATIVE: -march=native
# also switches on AMX, whose ggml kernels crash with a general protection fault on Sapphire-Rapids-class
# CPUs (Linux grants AMX tile state per thread; ggml-org/llama.cpp#20824, PR #26954). AMX stays off; AVX-512
# is used where the CPU has it, else AVX2/FMA/F16C. Each build is proved by a generation in a child process
# before it is kept; a crash marks it bad and the next, safer set is built; if none works the llama.cpp tests
# skip with the reason. Wheels are cached in WHEELHOUSE per (version, instruction set); 4-7 min per build on
# 2 cores, once per machine. See backends/llamacpp/build.py.
WHEELHOUSE ?= $(HOME)/.cache/boute/wheels
LLAMA_CPP  := llama-cpp-python==0.3.36
ENGINES    := $(VENV)/.engines-installed

# SGLang (backends/sglang/build.py; installs cached in SGLANG_HOME, keyed by the pins): the contract install (its
# own code for its parser and protocol models, ~40 s idle / ~2.5 min on busy cores, once) runs before make test;
# the CPU server venv + SmolLM2 bf16 (make sglang, ~7.5 min on 2 busy cores, once, 2.8 GB) is optional.
SGLANG_HOME ?= $(HOME)/.cache/boute/sglang
export BOUTE_SGLANG_HOME := $(SGLANG_HOME)

.PHONY: install warm lock engines sglang sglang-contract prometheus chromium demo test test-engines test-fast bench lint format experiments clean

install: $(STAMP)

# BoTorch's fused qLogNEHVI kernel is compiled here, once, with portable flags (~25 s), instead of by BoTorch
# inside the first search with -march=native (boute/optimize/acquisition/fused_kernel.py says why); and the
# caches a first search would build are built (make warm).
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt torch
	$(PIP) install -q -c constraints.txt -e '.[dev]'
	$(BIN)/python -m boute.optimize.acquisition.fused_kernel build
	@$(MAKE) --no-print-directory warm
	touch $(STAMP)

## Build ahead what the first search on a machine would build (boute/optimize/prepare.py): the project's
## bytecode, the static embedding table distilled from the packaged MiniLM (1-2 min on 2 cores, once per
## machine), and the built-in scenarios' routers, cascade verifiers and token counts, in $$BOUTE_CACHE_DIR or
## ~/.cache/boute, keyed as the search keys them. Idempotent (seconds when everything is cached: run it again
## after emptying the cache); a failure warns, and the search builds what is missing on first use instead.
## bench/bench_optimize_firstrun.py runs these same two commands as its install step.
warm:
	@test -x $(BIN)/python || { echo "no $(VENV): run make install first"; exit 1; }
	$(BIN)/python -m compileall -q boute router backends || echo "warning: some files did not byte-compile"
	$(BIN)/python -m boute.optimize.prepare || echo "warning: not every cache was built ahead; searches build what is missing on first use"

## Re-pin constraints.txt to what .venv holds (after installing a new version there and running the tests).
## No install first: the point is to record the venv as it is.
lock:
	@test -x $(BIN)/python || { echo "no $(VENV): run make install first"; exit 1; }
	$(BIN)/python tools/lock.py --out constraints.txt

## Build the llama.cpp engine once (cached in WHEELHOUSE) and install it with the model package.
engines: $(ENGINES)

$(ENGINES): $(STAMP) backends/llamacpp/build.py
	nice $(BIN)/python -m backends.llamacpp.build --wheelhouse $(WHEELHOUSE) --spec '$(LLAMA_CPP)'
	touch $(ENGINES)

## SGLang's own code for the contract tests (tests/test_sglang_contract.py); they skip with the reason if it fails.
sglang-contract: $(STAMP)
	nice $(BIN)/python -m backends.sglang.build contract

## Real SGLang on this CPU: its own venv (CPU torch 2.13.0, sglang --no-deps, stand-ins) and SmolLM2 as bf16.
sglang: $(STAMP)
	nice $(BIN)/python -m backends.sglang.build server

## System tools some tests use, from Debian's packages, installed through apt when absent and we are root (the
## package lists refreshed only when the first try fails); elsewhere each says so and its tests skip with the reason.
## `prometheus` (2.42 on bookworm, with promtool): tests/test_prometheus_*.py, docs/observability.md. On a host that
## runs systemd the package also starts its own prometheus service (port 9090); the tests use their own ports.
## `chromium` (headless, driven by the playwright wheel, which cannot download a browser here): tests/test_report.py.
APT_INSTALL = export DEBIAN_FRONTEND=noninteractive; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then echo "$(1) absent (install Debian's '$(1)' package as root)"; exit 1; fi; \
	apt-get install -y -q --no-install-recommends $(1) || { apt-get update -q && apt-get install -y -q --no-install-recommends $(1); }

prometheus:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || { $(call APT_INSTALL,prometheus); }

chromium:
	@command -v chromium >/dev/null || { $(call APT_INSTALL,chromium); }

## Run the main job on the built-in example scenario: optimise routing + deployment, write the plan (with its
## bundle) and its report, then serve it on emulated backends, verify the promise under the scenario's own
## traffic and add the verdict to the report (one self-contained HTML file: docs/report.md).
demo: $(STAMP)
	@mkdir -p out
	$(BIN)/boute optimize --out out/plan.json --plot out/pareto.png --db sqlite:///out/boute.db --report out/report.html
	$(BIN)/boute verify --plan out/plan.json --db sqlite:///out/boute.db --report out/report.html
	@echo "plan: out/plan.json (+ out/plan.bundle/)  report: out/report.html  pareto plot: out/pareto.png  experiments: boute experiments list --db sqlite:///out/boute.db"

## The full test suite (starts an embedded redis-server when none answers on 127.0.0.1:6379). Two workers:
## most of the suite waits on processes and sockets, so two share two cores well (7.5 -> 4.6 min here);
## --dist loadfile keeps each file on one worker, so module fixtures (emulated stacks) start once per file.
TEST_WORKERS ?= 2
test: $(STAMP)
	@$(MAKE) --no-print-directory engines || echo "warning: the llama.cpp engine did not build; its tests will skip"
	@$(MAKE) --no-print-directory sglang-contract || echo "warning: SGLang's contract install failed; its tests will skip"
	@$(MAKE) --no-print-directory prometheus || echo "warning: no prometheus/promtool; the Prometheus tests will skip"
	@$(MAKE) --no-print-directory chromium || echo "warning: no chromium; the report's browser tests will skip"
	$(BIN)/python -m tests.services $(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=20 -m "not sglang_server"

## The tests on the real SGLang CPU server (marked sglang_server; needs make sglang): its own protocol, abort and
## prefix-cache reports, then whole plans (two tiers; a replica lost under load; 4-7 min of both cores each).
## In make test they crowded the rest of the suite (16 min instead of 7, timing tests failing beside them).
test-engines: $(STAMP)
	$(BIN)/python -m tests.services $(BIN)/pytest -q -m sglang_server --durations=5

test-fast: $(STAMP)
	$(BIN)/python -m tests.services $(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not slow" -x

## Benchmarks: results land in bench/results/*.json and bench/results/README.md.
bench: $(STAMP)
	$(BIN)/python -m tests.services $(BIN)/python -m bench

## Reproduce the paper's evaluation (results in experiments/results/); QUICK=1 for the minutes-long version.
experiments: $(STAMP)
	$(BIN)/python -m experiments $(if $(QUICK),--quick,)

## Lint: style (ruff), the layer contract (import-linter: the core imports neither router nor backends, and
## those two only meet over HTTP/Redis), and types (mypy on boute/ and router/).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
