# onceflow: `make demo` shows it working, `make test` runs every test.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast lint typecheck bench clean

# setup.py compiles core/ and the worker's per-record modules (tables/, agents/) with mypyc:
# an edited source there means a new build.
# Where the machine has ccache, gcc's objects are kept between builds: after an edit inside
# a function only that module's C file is compiled again (the reinstall took 7.8 s against
# 28 s here, 1 of 85 compiler calls not in the cache).  A new function or method changes
# the header all of them include, and everything is compiled again either way.  The build
# requirements are installed in the environment and the build is not isolated: pip's
# isolated build environment is a new folder each time, on the compiler's include path,
# so no object was ever found in the cache.
CCACHE := $(shell command -v ccache 2>/dev/null)

$(STAMP): pyproject.toml setup.py $(wildcard core/*.py tables/*.py agents/*.py)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))' > $(VENV)/build-requirements.txt
	$(BIN)/python -m pip install --quiet -r $(VENV)/build-requirements.txt
	$(if $(CCACHE),CC="ccache $${CC:-gcc}") $(BIN)/python -m pip install --quiet --no-build-isolation -e '.[dev,spark]'
	touch $(STAMP)

# The archive of Spark's classes that a machine's first local Spark run writes
# (docs/spark.md, Local runs), written for this environment before the tests when it is
# not there: the suite starts about ten local JVMs, and each maps it instead of loading
# and verifying Spark's classes from its jars.  Writing it is a replay of a small scenario
# (about 25 s, once); the suite spent 36 to 47 s less CPU a run with it
# (bench/suite_cpu.py, two pairs, 2026-11-27).  If it cannot be written the tests run
# without it.
CLASS_DATA_MISSING := $(BIN)/python -c 'import sys; from onceflow.pipeline.session import class_data_missing; sys.exit(0 if class_data_missing() else 1)'

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
	$(CLASS_DATA_MISSING) && { $(BIN)/onceflow replay --spark tests/scenarios/and_join_complete > /dev/null \
	  || echo "make: Spark's classes were not saved; the Spark tests start slower" >&2; } || true
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
