# figtank: the two commands a newcomer needs are `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# What `make run` needs: the runtime alone (no test, spark or docs extras).
RUNTIME_STAMP := $(VENV)/.installed-runtime

.PHONY: run test lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# setup.py builds the Cython extensions in place: edits to them rebuild.
SOURCES_BUILT := pyproject.toml setup.py protocols/_speedups.pyx gateway/store/_fsync.pyx \
	gateway/io/_fanout.pyx

$(RUNTIME_STAMP): $(BIN)/python $(SOURCES_BUILT)
	$(BIN)/python -m pip install --quiet -e .
	touch $(RUNTIME_STAMP)

# Everything (the suite, Spark, the docs site); it holds the runtime too.
$(STAMP): $(BIN)/python $(SOURCES_BUILT)
	$(BIN)/python -m pip install --quiet -e '.[test,spark,docs]'
	touch $(STAMP) $(RUNTIME_STAMP)

# $(call serve_flag,VAR,--flag): "--flag 'value'" when VAR was given on the command line
# (an empty value turns a listener off), else nothing: the config file or figtank's
# defaults decide.
serve_flag = $(if $(filter command line,$(origin $(1))),$(2) '$($(1))')

## Start the gateway on its embedded store in ./data (Figg 127.0.0.1:8119, Tank
## 127.0.0.1:11011, Kafka 127.0.0.1:9092, HTTP and console http://127.0.0.1:8080/, metrics
## 127.0.0.1:9464). Other ports, another place, a config file:
## make run FIGG=127.0.0.1:8120 TANK=127.0.0.1:11012 KAFKA=127.0.0.1:9093 HTTP=127.0.0.1:8081 DATA=./data2
## make run CONFIG=figtank.toml   (the variables given override the file)
run: $(RUNTIME_STAMP)
	$(BIN)/figtank serve $(RUN_FLAGS)

RUN_FLAGS = $(strip $(call serve_flag,CONFIG,--config) $(call serve_flag,DATA,--data-dir) \
	$(call serve_flag,FIGG,--figg-listen) $(call serve_flag,TANK,--tank-listen) \
	$(call serve_flag,KAFKA,--kafka-listen) $(call serve_flag,METRICS,--metrics-listen) \
	$(call serve_flag,HTTP,--http-listen))

## Set everything up and run the whole suite with the compiled extension, and again in
## pure Python the tests whose code paths the extension replaces (PURE_TESTS).
## Three pytest workers (one test file each at a time): most tests wait on sockets and
## subprocesses (two workers kept the two cores ~55 % busy), so a third overlaps those
## waits (7 min 2 s -> 5 min 58 s for the compiled run on two cores). The longest files go
## first, by their durations in the last run (kept in .pytest_cache; on a first run the
## Spark tests, the install, then files with tests marked slow: tests/conftest.py), so no
## long file is left to run alone at the end. mypy and the pure-Python pass (one process:
## 3 min 10-20 s on the 2-core machine, beside a compiled pass of 8 min 32-50 s) run
## beside the compiled pass, whose workers wait on sockets and subprocesses much of the
## time (run after it they added ~40 s and ~54 s); their output follows the compiled
## pass's. `make test` in all: 8 min 35-52 s there (a fourth worker: 8 min 38 s, no
## better); on a fresh clone 10 min, the Spark class archive made on the way.
## `make lint` is the quick check of the code alone.
test: $(STAMP) system-tools
	$(BIN)/ruff check .
	$(BIN)/python -m compileall -q -j 0 protocols gateway examples tests
	@side=$$(mktemp); trap 'rm -f "$$side"' EXIT; \
	{ $(BIN)/mypy && \
	  FIGTANK_PURE_PYTHON=1 $(BIN)/python -m pytest -q $(PURE_TESTS) \
		$(PURE_SAME:%=--ignore=%) -m "not differential"; } >"$$side" 2>&1 & side_pid=$$!; \
	$(BIN)/python -m pytest -q $(PYTEST_WORKERS) $(PYTEST_DURATIONS); compiled=$$?; \
	wait $$side_pid; lane=$$?; \
	echo "--- mypy and the pure-Python pass (run beside the compiled pass):"; \
	cat "$$side"; \
	[ $$compiled -eq 0 ] && [ $$lane -eq 0 ]

# Bytecode is cached while the suite runs, whatever the environment says (this machine's
# sets PYTHONDONTWRITEBYTECODE=1): the suite starts hundreds of Python processes (figtank
# serve, the CLI, the examples, Spark's Python workers), and without cached bytecode each
# compiled every module it imports again (1.4 s of CPU for `figtank --version`, 0.6 s
# with it; tests/test_cli_failures.py 70 s of CPU, 47 s with it), and so did each pytest
# worker for every test module it rewrites. compileall above writes the project's; the
# __pycache__ folders are ignored by git.
test: export PYTHONDONTWRITEBYTECODE =

PYTEST_WORKERS = -n 3 --dist loadfile --no-loadscope-reorder
# The slowest tests of each run, for whoever next works on the suite's time.
PYTEST_DURATIONS = --durations=15

# The protocol codecs, the listeners, the store, the bridge and serving: everything the
# compiled loops (protocols/_speedups.pyx, gateway/store/_fsync.pyx,
# gateway/io/_fanout.pyx: the HTTP fan-out and its slow subscribers) sit
# under (the Kafka listener: its produce, fetch and hand-off paths; the rest of
# tests/kafka is coordination and access, above those loops). Spark, the examples, the
# bench and the CLI do not depend on them (a pure-Python install's command line, serving
# every client family, is tests/test_install.py's).
PURE_TESTS = tests/protocols tests/figg tests/tank tests/store tests/bridge \
	tests/test_embedded.py tests/test_bundle.py tests/test_reader_lag.py \
	tests/test_serve.py tests/kafka/test_real_clients.py \
	tests/kafka/test_kafka_requests.py tests/kafka/test_handoff.py \
	tests/kafka/test_idempotence.py tests/kafka/test_produce_errors.py tests/io/test_fanout.py \
	tests/kafka/test_shared_fetch.py tests/kafka/test_fetch_compression.py \
	tests/http/test_slow_subscribers.py
# ... less what runs the same code in either run: the files that enter no pure-Python twin
# (the Kafka message codecs but Produce's, the generator, the wire primitives, the store's
# segment scan, the Tank client: traced, run under FIGTANK_PURE_PYTHON=1 they call no
# ``*_py`` reference, the Python syncer or the Python fan-out), and the ``differential``
# tests (they call both twins themselves, in either run: the compiled pass ran them).
PURE_SAME = tests/protocols/kafka/test_batch.py tests/protocols/kafka/test_kafka_nullable.py \
	tests/protocols/kafka/test_kafka_roundtrip.py tests/protocols/kafka/test_kafka_sasl_tokens.py \
	tests/protocols/kafka/test_kafka_spec.py tests/protocols/test_figg_fuzz.py \
	tests/protocols/test_frame_rest.py tests/protocols/test_generate.py tests/protocols/test_spec.py \
	tests/protocols/test_tank_fuzz.py tests/protocols/test_tank_messages.py \
	tests/protocols/test_wire.py tests/store/test_scan.py tests/tank/test_client.py

# mypy checks what [tool.mypy] in pyproject.toml lists (protocols/ and gateway/), strictly.
# (ruff's formatter is not the house style: the code is laid out by hand, so no format check.)
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

## Benchmark suite against a figtank started for it (fsync and os); writes
## bench-results.json and bench-results.md. Another broker:
## make bench BENCH_ARGS="--target tank-4.0 --tank HOST:PORT"
## figtank beside a running peer (medians of 3 alternating rounds, ratio figtank/peer):
## make bench BENCH_ARGS="--peer tank-4.0 --peer-tank 127.0.0.1:11311"
## (or --peer-figg HOST:PORT; --rounds N)
bench: $(STAMP)
	$(BIN)/python -m gateway.bench.suite $(BENCH_ARGS)

## figtank beside the peers, measured by the peers' own clients (issue 27's table):
## make bench-peers FIGG_BENCH=PATH TANK_CLI=PATH PEER_FIGG=HOST:PORT PEER_TANK=HOST:PORT
## starts figtank twice (fsync, then os): figg-bench against each, tank-cli against os.
## Leave out a client and its peer to skip that protocol; PEERS_ARGS="--rounds 1" etc.
FIGG_BENCH ?=
TANK_CLI ?=
PEER_FIGG ?=
PEER_TANK ?=
PEERS_ARGS ?=

.PHONY: bench-peers
bench-peers: $(STAMP)
	$(BIN)/python -m gateway.bench.peers --start-figtank fsync,os \
		$(if $(FIGG_BENCH),--figg-bench $(FIGG_BENCH)) $(if $(PEER_FIGG),--peer-figg $(PEER_FIGG)) \
		$(if $(TANK_CLI),--tank-cli $(TANK_CLI)) $(if $(PEER_TANK),--peer-tank $(PEER_TANK)) \
		$(PEERS_ARGS)

## The peers' own clients straight at figtank and through a gateway in front of its Kafka
## listener (figtank serve --upstream-kafka; issue 35's table):
## make bench-gateway FIGG_BENCH=PATH TANK_CLI=PATH   (PEERS_ARGS="--rounds 1" etc.)
.PHONY: bench-gateway
bench-gateway: $(STAMP)
	$(BIN)/python -m gateway.bench.peers --start-figtank os --gateway \
		$(if $(FIGG_BENCH),--figg-bench $(FIGG_BENCH)) $(if $(TANK_CLI),--tank-cli $(TANK_CLI)) \
		$(PEERS_ARGS)

# Programs the suite drives as real clients (kcat; curl and headless Chromium through
# chromedriver for the HTTP listener; nginx in front of it; node for figtank.js and, with
# npm, for kafkajs, which the Kafka tests install from npm into .venv at a pinned version:
# tests/kafka/kafkajs.py), as COMMAND:DEBIAN_PACKAGE: installed with apt-get where missing
# (CI runs on a fresh machine as root). A command is looked for on PATH and in /usr/sbin
# (nginx's place, not on every user's PATH).
SYSTEM_TOOLS = kcat:kcat curl:curl chromium:chromium chromedriver:chromium-driver nginx:nginx \
	node:nodejs npm:npm

.PHONY: system-tools
system-tools:
	@missing=$$(for tool in $(SYSTEM_TOOLS); do command -v $${tool%%:*} >/dev/null || \
		[ -x /usr/sbin/$${tool%%:*} ] || echo $${tool#*:}; done); \
	if [ -n "$$missing" ]; then \
		echo "installing the suite's system tools:" $$missing; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing \
			|| { echo "make test needs these Debian packages: $$missing" >&2; exit 1; }; \
	fi

.PHONY: docs
## Build the documentation site (docs/, mkdocs.yml) into ./site; a broken link or anchor
## fails the build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
