# onceflow: `make demo` shows it working, `make test` runs every test.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast lint typecheck bench clean

# setup.py compiles core/ and the worker's per-record modules (tables/, agents/) with mypyc:
# an edited source there means a new build.
$(STAMP): pyproject.toml setup.py $(wildcard core/*.py tables/*.py agents/*.py)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,spark]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m onceflow.app.demo

# Twelve processes on two cores: the integration tests wait on the broker and on consumer
# groups much of the time (a worker's first group join on the embedded broker takes half
# its 10 s session).  With eight, the processes' tests summed to 2,092 s of wall time
# (at least 261 s a run) while the cores were half idle in its second half; with twelve
# a run's wall time follows its CPU (bench/suite_cpu.py, 2026-11-27: 260 s for 476 s of
# CPU).  Serially (TEST_PROCESSES=0) every test still passes.
TEST_PROCESSES ?= 12

# Python keeps compiled bytecode (__pycache__, git-ignored) as it does by default, also where
# the environment says not to (PYTHONDONTWRITEBYTECODE, set on the CI machines): without it
# each of the suite's processes compiled every test module and every interpreted onceflow
# module it imported again (collecting the tests: 4.1 s of CPU a process, 1.9 s with the
# bytecode kept, thirteen processes a run).  The bytecode is compiled first, in one
# command on both cores (under a second on a fresh clone): otherwise on a clone's first run
# the processes, starting together, would each compile all of it.
test: $(STAMP)
	$(BIN)/python -m compileall -q -j 0 core app agents tables pipeline tests
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -n $(TEST_PROCESSES) --dist loadscope

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not integration and not spark"

lint: $(STAMP)
	$(BIN)/ruff check core app agents tables pipeline tests bench

typecheck: $(STAMP)
	$(BIN)/mypy core

bench: $(STAMP)
	$(BIN)/python bench/replay.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache core/*.so tables/*.so agents/*.so
