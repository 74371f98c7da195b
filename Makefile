# exod developer entry points. `make run` and `make test` are the README's quick start.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

# pytest-xdist workers. Many integration tests wait on daemons, runners and ladders, so more
# workers than cores keep both of a 2-core machine's cores busy; but not 4: a tensor group's rank
# spins in mlx's ring while its peer waits for a core, and the tier spent more CPU than it saved
# (docs/development.md, Where the time goes).
WORKERS ?= 3
PYTEST := $(BIN)/pytest --dist loadgroup --no-loadscope-reorder
# The quiet phase: the systemd tier and the tests with a timing bound (marked `timing`), in three
# groups, each one test at a time on a worker of its own, beside the unit tier on the fourth;
# never beside the integration tier (tests/conftest.py: QUIET_GROUPS).
QUIET := -m "not integration or timing"
QUIET_WORKERS := 4
# What the quiet phase collects: every worker imports each module it collects, and the
# integration tier's modules (mlx-lm, the SDKs, the agents' libraries) are ~8 CPU-s a worker;
# of those only the modules with a `timing` test are needed here.
QUIET_PATHS = tests/unit tests/system $(shell grep -l 'mark\.timing' tests/integration/*.py)

# Python writes each module's bytecode (.pyc) when it is first imported, as it does by default,
# even where the environment says not to (PYTHONDONTWRITEBYTECODE, as on CI's machines): there
# every runner, probe and daemon compiled what it imported from source, every time. So nothing
# is compiled ahead that no process imports: the test extras alone are ~14,000 files that no test
# imports (anthropic's and openai's SDKs, pandas, scipy...), ~35 CPU-s of a fresh clone's set-up.
unexport PYTHONDONTWRITEBYTECODE
# An editable install is never byte-compiled by pip: exod, its tests and bench are compiled
# once before the tests run in parallel, so their processes do not each compile them at once
# (a runner compiling exod spends ~15% of its start on it). Python recompiles any .pyc whose
# source has changed since.
BYTECODE = $(BIN)/python -m compileall -q -j 0
# pytest rewrites the asserts of each test module it imports, and keeps the result beside the
# module's .pyc, which each of `make test`'s 7 workers would otherwise write at once for every
# module it collects (half of a worker's collection: 13 -> 6.7 CPU-s in the quiet phase, 10 ->
# 5.6 in the integration tier). Rewritten once here, read by every worker.
REWRITES = $(BIN)/pytest --collect-only -q -p no:cacheprovider tests

# The coding agents the integration tests drive (Claude Code, Codex CLI): npm's newest when
# first set up, in a git-ignored folder of the checkout. `make agents` updates them.
# Defined before the rules that name it: make expands a rule's prerequisites as it reads it.
AGENTS ?= .agents

.PHONY: run test test-unit test-integration test-profile test-system warm rewrites setup \
	setup-test agents agents-matrix install bench bench-report man lint clean

run: setup  ## set up, then run the daemon in the foreground on the built-in demo model
	$(BIN)/exod run --demo

test: setup-test  ## set up; lint beside warm; the integration tier; then the quiet phase
	$(MAKE) --no-print-directory -j3 --output-sync=target lint warm rewrites
	$(PYTEST) -n $(WORKERS) -m "not timing" --durations=25 tests/integration
	$(PYTEST) -n $(QUIET_WORKERS) $(QUIET) $(QUIET_PATHS)

test-unit: setup-test  ## the unit tier: no processes, no mlx (tens of seconds)
	$(PYTEST) -n $(WORKERS) tests/unit

test-integration: setup-test warm rewrites  ## the integration tier: real daemons, runners and mlx
	$(PYTEST) -n $(WORKERS) -m "not timing" --durations=25 tests/integration
	$(PYTEST) -n 1 -m timing tests/integration

test-profile: setup-test warm rewrites  ## the integration tier, with each test's CPU-seconds (tests/cpu_profile.py)
	PYTHONPATH=. $(PYTEST) -n $(WORKERS) -m "not timing" -p tests.cpu_profile tests/integration

test-system: setup-test  ## the system tier: exod under a real systemd in private namespaces
	$(PYTEST) -n 1 tests/system

rewrites: setup-test  ## pytest's rewritten test modules, kept once for every worker (REWRITES)
	$(REWRITES) > /dev/null

warm: setup-test  ## mlx's kernel cache, the demo model, bytecode: once, before tests run in parallel
	$(BYTECODE) exod tests bench
	$(BIN)/python -m tests.warm

setup: $(VENV)/.run-deps
# PyPI's packages and npm's agents are fetched side by side (npm waits only for Node).
setup-test:
	@$(MAKE) --no-print-directory -j2 $(VENV)/.test-deps $(AGENTS)/.installed

$(AGENTS)/.installed: scripts/agents.sh | $(VENV)/.system-test
	scripts/agents.sh
	touch $@

agents: | $(VENV)/.system-test  ## update the coding agents the tests drive to npm's newest
	scripts/agents.sh
	touch $(AGENTS)/.installed

# Packages are installed by uv (from PyPI into the venv, ~2 s), which downloads and installs in
# parallel: a fresh clone's test set-up 87 s -> 33 s, the same packages at the same versions.
# Not byte-compiled at install (see PYTHONDONTWRITEBYTECODE above); pip, where uv cannot be
# installed, compiles as it installs.
PIP_INSTALL = $(BIN)/python -m pip install -q
UV_INSTALL = $(BIN)/uv pip install -q --python $(BIN)/python
INSTALL_DEPS = { $(PIP_INSTALL) uv && $(UV_INSTALL) $(1); } || $(PIP_INSTALL) $(1)
comma := ,

$(VENV)/.run-deps: pyproject.toml scripts/system-deps.sh
	scripts/system-deps.sh run
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(call INSTALL_DEPS,-e .)
	$(BYTECODE) exod
	touch $@

# Debian's packages the tests need (Node among them), after the run's: one apt at a time.
$(VENV)/.system-test: scripts/system-deps.sh | $(VENV)/.run-deps
	scripts/system-deps.sh test
	touch $@

# The tests cover the optional extras too (vision: mlx-vlm), so the test set-up installs them.
$(VENV)/.test-deps: $(VENV)/.run-deps $(VENV)/.system-test
	$(call INSTALL_DEPS,-e '.[test$(comma)vision]')
	touch $@

# A Python from anywhere will do (pyenv or uv under a home directory too): `exod install` binds
# what the service needs to read, read-only (docs/service.md). sudo's path has no
# pyenv shim: name the interpreter (`sudo make install PYTHON=~/.pyenv/versions/X/bin/python3`).
INSTALL_PREFIX ?= /opt/exod
install:  ## as root: exod in a venv at $(INSTALL_PREFIX), then its service files (exod install)
	scripts/system-deps.sh run
	$(PYTHON) -m venv $(INSTALL_PREFIX)
	$(INSTALL_PREFIX)/bin/python -m pip install -q .
	$(INSTALL_PREFIX)/bin/exod install

# docs/agents.md's conformance matrix (tests/agents/matrix.py): the tests that observe its cells,
# each observation appended to MATRIX_OUT, then docs/agents-matrix.json and the page from them
# (written even when a test fails: its cell then says so; the exit status is pytest's).
MATRIX_TESTS = tests/integration/test_agents.py tests/integration/test_agent_cache.py \
	tests/integration/test_long_sessions.py tests/integration/test_formats.py
MATRIX_OUT = build/agents-matrix.jsonl

agents-matrix: setup-test warm rewrites  ## rerun the agents' and formats' tests; write docs/agents.md's matrix
	mkdir -p $(dir $(MATRIX_OUT)) && rm -f $(MATRIX_OUT)
	EXOD_MATRIX_OUT=$(abspath $(MATRIX_OUT)) $(PYTEST) -n $(WORKERS) $(MATRIX_TESTS); \
		status=$$?; $(BIN)/python -m tests.agents.matrix write $(MATRIX_OUT) && exit $$status

bench: setup-test  ## benchmarks: print ratios against baselines measured in the same run, and record them (bench/results/)
	$(BIN)/python -m bench

bench-report: setup-test  ## docs/benchmarks.md and its plots (docs/benchmarks/), from bench/results/*.jsonl
	$(BIN)/python -m bench.report

man: setup  ## exod.yaml(5)'s KEYS section, written from the schema (exod/config/schema.py, exod/wire/options.py)
	$(BIN)/python -c 'import sys; from exod.config.explain import write_pages; \
		write_pages(sys.argv[1:])' man/exod.yaml.5

lint: setup-test
	$(BIN)/ruff check exod tests bench
	$(BIN)/mypy exod tests/models

clean:
	rm -rf $(VENV) $(AGENTS) build *.egg-info .pytest_cache
