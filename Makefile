# Two entry points, each creates the environment first (see README "Quick start").
# `make demo` installs only the library (no dev tools, no PySpark); `make test`
# installs the dev tools and the `spark` extra (the telemetry job's tests).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
BASE := $(VENV)/.installed-base
STAMP := $(VENV)/.installed-dev

.PHONY: demo sim-demo test test-fast test-compiled compiled pure lint bench bench-runtime reproduce clean \
	device-budget arm64-check

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(BASE): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $(BASE)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev,spark]'
	touch $(STAMP)

## demo: set up (library only), then run a local LAN-chat fleet (5 real nodes, TCP + mDNS on 127.0.0.1)
demo: $(BASE)
	$(BIN)/python -m edge_examples.chat --demo

## sim-demo: simulate the embedded default fleet (64 nodes) and print a summary
sim-demo: $(BASE)
	$(BIN)/p2p demo

## lint: ruff and mypy --strict
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

## test: set up, lint, then the whole test suite (what CI runs)
test: lint
	$(BIN)/python -m pytest -q

## test-fast: skip tests marked slow (local iteration)
test-fast: lint
	$(BIN)/python -m pytest -q -m "not slow"

## compiled: the optional mypyc build of the cores, in place (needs a C compiler; `make pure` undoes it)
compiled: $(STAMP)
	$(BIN)/python -m p2p._build --compile >$(VENV)/mypyc.log 2>&1 || \
		{ tail -20 $(VENV)/mypyc.log; exit 1; }
	test "$$($(BIN)/python -m p2p._build)" = mypyc

## pure: remove the compiled build (back to pure Python)
pure:
	rm -rf build
	find causal topics vcube p2p -name "*.so" -delete
	test "$$($(BIN)/python -m p2p._build)" = pure

## test-compiled: the core, simulator and property tests on the compiled build (CI runs both builds)
test-compiled: compiled
	P2P_EXPECT_BUILD=mypyc $(BIN)/python -m pytest -q $(COMPILED_TESTS); \
		status=$$?; $(MAKE) --no-print-directory pure; exit $$status

## bench: simulator speed benchmark (writes bench/out/sim_speed.json)
bench: $(STAMP)
	$(BIN)/python -m bench.sim_speed

COMPILED_TESTS := tests/test_core.py tests/test_aggregation.py tests/test_vcubeps_aggregation.py \
	tests/test_failures.py tests/test_sim.py tests/test_sim_golden.py tests/test_sim_detector.py \
	tests/test_checks.py tests/test_machine.py tests/test_wire.py tests/test_properties.py \
	tests/test_scenario.py tests/test_vcube.py tests/test_sim_links.py tests/test_sim_twin.py \
	tests/test_build.py tests/test_node.py tests/test_node_failures.py tests/test_links.py \
	tests/test_live_fuzz.py tests/test_detector.py tests/test_checkcli.py tests/test_causal_buffer.py \
	tests/test_sim_queue.py tests/test_fence.py

BENCH_STAMP := $(VENV)/.installed-bench

$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[dev,spark,bench]'
	touch $(BENCH_STAMP)

## bench-runtime: runtime benchmarks against ZeroMQ and Zenoh (~7 min; writes bench/out/runtime.json)
bench-runtime: $(BENCH_STAMP)
	$(BIN)/python -m bench.runtime

## reproduce: rerun the thesis' §5.6 experiments (long; see docs/thesis-results.md)
reproduce: $(STAMP)
	$(BIN)/python -m bench.reproduce_thesis

## device-budget: an idle node's RSS/threads/sockets and CPU per message at 100 and 1,000 msg/s,
## pure and compiled builds (~2 min plus the compilation; writes tools/results/devices-*.json)
device-budget: $(STAMP)
	$(MAKE) --no-print-directory pure
	$(BIN)/python -m tools.device_budget --out tools/results/devices-pure.json
	$(MAKE) --no-print-directory compiled
	$(BIN)/python -m tools.device_budget --out tools/results/devices-mypyc.json; \
		status=$$?; $(MAKE) --no-print-directory pure; exit $$status

## arm64-check: one emulated aarch64 node (qemu-user, debootstrap root, wheels only) beside two
## native ones on a namespace LAN (root; installs qemu-user-static and debootstrap if missing;
## ~1 min, the first run also builds the root in /var/tmp/p2p-arm64-root; writes tools/results/arm64.json)
arm64-check: $(BASE)
	@PATH="$$PATH:/usr/sbin:/sbin" command -v debootstrap >/dev/null && \
		test -x /usr/bin/qemu-aarch64-static || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
		qemu-user-static debootstrap >/dev/null; }
	$(BIN)/python -m tools.arm64_check --out tools/results/arm64.json

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
