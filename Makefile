# exod developer entry points. `make run` and `make test` are the README's quick start.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: run test setup setup-test install bench lint clean

run: setup  ## set up, then run the daemon in the foreground on the built-in demo model
	$(BIN)/exod run --demo

test: setup-test  ## set up, then run the whole test suite
	$(BIN)/pytest

setup: $(VENV)/.run-deps
setup-test: $(VENV)/.test-deps

$(VENV)/.run-deps: pyproject.toml scripts/system-deps.sh
	scripts/system-deps.sh run
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.test-deps: $(VENV)/.run-deps
	scripts/system-deps.sh test
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

# A Python from anywhere will do (pyenv or uv under a home directory too): `exod install` binds
# what the service needs to read, read-only (README: Running as a service).
INSTALL_PREFIX ?= /opt/exod
install:  ## as root: exod in a venv at $(INSTALL_PREFIX), then its service files (exod install)
	scripts/system-deps.sh run
	$(PYTHON) -m venv $(INSTALL_PREFIX)
	$(INSTALL_PREFIX)/bin/python -m pip install -q .
	$(INSTALL_PREFIX)/bin/exod install

bench: setup-test  ## benchmarks: print ratios against baselines measured in the same run
	$(BIN)/python -m bench

lint: setup-test
	$(BIN)/ruff check exod tests bench
	$(BIN)/mypy exod

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
