# Switchboard — the README's commands.
#   make demo   build everything and run a gateway with a simulator and the dashboard
#   make test   everything CI checks: format, lints, unit, integration, black-box clients
SHELL := /bin/bash
CARGO ?= cargo
BIN := target/release/switchboard
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo build test fmt-check lint rust-test black-box py-deps node-deps python-test node-test bench clean redis-deps fuzz-build

build:
	$(CARGO) build --release --locked -p switchboard

demo: build
	$(BIN) demo

test: fmt-check lint rust-test black-box fuzz-build
	@echo "make test: all suites passed"

fmt-check:
	$(CARGO) fmt --all -- --check

lint:
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

# The Redis broker tests and the cluster tests start a real redis-server on a spare loopback
# port; install it when it is missing.
redis-deps:
	@command -v redis-server >/dev/null || apt-get install -y redis-server

rust-test: build redis-deps
	$(CARGO) test --workspace --locked

black-box: build python-test node-test

# The fuzz targets (fuzz/, docs/security.md) build with nightly and cargo-fuzz; running them
# is a separate, long step: cargo +nightly fuzz run <target> --fuzz-dir fuzz.
fuzz-build:
	@if ! $(CARGO) +nightly --version >/dev/null 2>&1; then \
		echo "fuzz-build: SKIPPED — no nightly toolchain (rustup toolchain install nightly)"; \
	else \
		$(CARGO) +nightly fuzz --version >/dev/null 2>&1 || $(CARGO) install --locked cargo-fuzz; \
		cd fuzz && $(CARGO) +nightly fuzz build; \
	fi

# Clients nobody here wrote: Python websockets and Node ws, against the release binary.
$(VENV)/.installed: tests/python/requirements.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r tests/python/requirements.txt
	touch $@

py-deps: $(VENV)/.installed

tests/node/node_modules/.package-lock.json: tests/node/package-lock.json
	cd tests/node && npm ci --no-audit --no-fund --loglevel=error

node-deps: tests/node/node_modules/.package-lock.json

python-test: py-deps
	SWITCHBOARD_BIN=$(CURDIR)/$(BIN) $(PY) -m pytest -q tests/python

node-test: node-deps
	cd tests/node && SWITCHBOARD_BIN=$(CURDIR)/$(BIN) node --test

bench: build
	@echo "see docs/benchmarks.md for the commands behind each figure"

clean:
	$(CARGO) clean
	rm -rf $(VENV) tests/node/node_modules
