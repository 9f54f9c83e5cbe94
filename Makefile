# figtank: the two commands a newcomer needs are `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# setup.py builds the Cython extensions in place: edits to them rebuild.
$(STAMP): $(BIN)/python pyproject.toml setup.py protocols/_speedups.pyx gateway/store/_fsync.pyx
	$(BIN)/python -m pip install --quiet -e '.[test,spark]'
	touch $(STAMP)

## Start the gateway on its embedded store in ./data.
run: $(STAMP)
	$(BIN)/figtank serve --data-dir ./data

## Set everything up and run the whole suite: with the compiled extension, then pure Python.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q
	FIGTANK_PURE_PYTHON=1 $(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

## Benchmark suite against a figtank started for it (fsync and os); writes
## bench-results.json and bench-results.md. Another broker:
## make bench BENCH_ARGS="--target tank-4.0 --tank HOST:PORT"
## figtank beside a running peer (medians of 3 alternating rounds, ratio figtank/peer):
## make bench BENCH_ARGS="--peer tank-4.0 --peer-tank 127.0.0.1:11311"
## (or --peer-figg HOST:PORT; --rounds N)
bench: $(STAMP)
	$(BIN)/python -m gateway.bench.suite $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
