# scalebench: `make demo` and `make test` each set themselves up on a fresh machine.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RUN_STAMP := $(VENV)/.installed-run
TEST_DB ?= scalebench_test
# pytest-xdist processes for `make test`; worker N > 0 uses the database $(TEST_DB)_N (tests/conftest.py)
TEST_WORKERS ?= 3
export TEST_DATABASE_URL ?= postgresql+psycopg://root@127.0.0.1:5432/$(TEST_DB)
export TEST_REDIS_URL ?= redis://127.0.0.1:6379/15

.PHONY: demo test test-fast venv services testdb lint clean

# Two stages: what `make demo` needs (the service, the CLI, the CPU runner), then the test and lint tools.
$(RUN_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# the CPU build of torch lies on disk; installing it first keeps pip from pulling a CUDA build
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[cli,runner]'
	touch $(RUN_STAMP)

$(STAMP): $(RUN_STAMP)
	$(BIN)/pip install -q -e '.[cli,runner,dev]'
	touch $(STAMP)

venv: $(STAMP)

services:
	bash scripts/ensure-services.sh

testdb: venv services
	bash scripts/fresh-test-db.sh "$(TEST_DB)"
	for n in $$(seq 1 $$(($(TEST_WORKERS) - 1))); do bash scripts/fresh-test-db.sh "$(TEST_DB)_$$n"; done

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: venv services testdb
	bash scripts/test-deps.sh
	$(BIN)/python -m pytest -q --durations=15 -n $(TEST_WORKERS) --ignore=tests/api/test_fuzz.py $(PYTEST_ARGS)
	# schemathesis runs each API operation as a sub-test, which it reports one by one only without xdist
	$(BIN)/python -m pytest -q tests/api/test_fuzz.py

test-fast: venv
	$(BIN)/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

demo: $(RUN_STAMP)
	$(BIN)/python -m cli.demo

clean:
	rm -rf .scalebench demo-out artifacts
