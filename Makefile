# Switchboard — the README's commands.
#   make demo   build everything and run a gateway with a simulator and the dashboard
#   make test   everything CI checks: format, lints, unit, integration, black-box clients
SHELL := /bin/bash
CARGO ?= cargo
BIN := target/release/switchboard
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo build test fmt-check lint lint-deps rust-test black-box py-deps client-deps node-deps python-test node-test bench clean redis-deps fuzz-build web-deps web-build web-test browser-deps browser-test bench-dashboard mqtt-deps failpoints-build suite-deps rust-build rust-run python-run node-run web-run browser-run

build: web-build
	$(CARGO) build --release --locked -p switchboard

# The demo's control room runs a simulated device on mosquitto (installed when missing).
demo: build mqtt-deps
	$(BIN) demo

# The checks and the builds the suites start go first, one after the other (each keeps both
# cores busy); then the suites run in two lanes side by side (scripts/test-lanes.sh), since
# they mostly wait on sockets and child processes.
test: fmt-check lint build failpoints-build suite-deps
	MAKE="$(MAKE)" scripts/test-lanes.sh
	@echo "make test: all suites passed"

# What the suites need besides the binaries: test servers, clients, browsers, packages.
suite-deps: redis-deps py-deps client-deps node-deps mqtt-deps browser-deps web-build \
	tests/browser/node_modules/.package-lock.json

fmt-check:
	$(CARGO) fmt --all -- --check

# Clippy, and no import cycle in any language: between the modules of a crate or the Python
# scripts (scripts/check-cycles.py), of the Python client (import-linter; its contracts are in
# clients/python/pyproject.toml, read from src/ rather than the installed copy), and of the
# TypeScript SDK and dashboard (dpdm, `npm run cycles` in web/).
lint: lint-deps
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings
	python3 scripts/check-cycles.py
	cd clients/python && PYTHONPATH=src $(CURDIR)/$(VENV)/bin/lint-imports --no-cache --no-logo
	cd web && npm run --silent cycles

# The lint's tools: import-linter in the test virtualenv, dpdm in web/node_modules.
$(VENV)/.lint-installed: $(VENV)/.installed scripts/lint-requirements.txt
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r scripts/lint-requirements.txt
	touch $@

lint-deps: $(VENV)/.lint-installed web-deps

# The Redis broker tests and the cluster tests start a real redis-server on a spare loopback
# port (the TLS tests sign its certificate with `openssl`); install them when missing.
redis-deps:
	@command -v redis-server >/dev/null || apt-get install -y redis-server
	@command -v openssl >/dev/null || apt-get install -y openssl

# The OPC UA source's tests run a real OPC UA server from the test virtualenv (asyncua).
rust-test: build redis-deps py-deps
	@$(MAKE) --no-print-directory rust-build rust-run

rust-build:
	$(CARGO) test --workspace --locked --no-run

# The tests of one binary mostly wait on the servers they start: four at a time on two cores.
rust-run:
	$(CARGO) test --workspace --locked -- --test-threads=4

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
	# pysparkplug (an independent Sparkplug B implementation the tests decode commands with)
	# pins paho-mqtt<2, which the other tests outgrew; only its payload code is used.
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps pysparkplug==0.6.1
	touch $@

# A Sparkplug B edge node made of pysparkplug's own EdgeNode (test_sparkplug_edge_node.py)
# needs the paho-mqtt 1 it pins: a virtualenv of its own.
SPVENV := .venv-sparkplug
$(SPVENV)/.installed: tests/python/requirements-sparkplug.txt
	python3 -m venv $(SPVENV)
	$(SPVENV)/bin/pip install --quiet --disable-pip-version-check -r tests/python/requirements-sparkplug.txt
	touch $@

py-deps: $(VENV)/.installed $(SPVENV)/.installed

# The Python client package (clients/python), installed into the test virtualenv whenever one
# of its files changes; its stale build directory goes first so no deleted module is packaged.
$(VENV)/.client-installed: $(VENV)/.installed clients/python/pyproject.toml $(shell find clients/python/src -name '*.py')
	rm -rf clients/python/build
	$(VENV)/bin/pip install --quiet --disable-pip-version-check './clients/python[msgpack]'
	touch $@

client-deps: $(VENV)/.client-installed

tests/node/node_modules/.package-lock.json: tests/node/package-lock.json
	cd tests/node && npm ci --no-audit --no-fund --loglevel=error

node-deps: tests/node/node_modules/.package-lock.json

# The MQTT source tests start a real mosquitto on a spare loopback port (mosquitto_sub checks
# writes); install it when missing.
mqtt-deps:
	@command -v mosquitto >/dev/null || command -v /usr/sbin/mosquitto >/dev/null || apt-get install -y mosquitto mosquitto-clients
	@command -v mosquitto_sub >/dev/null || apt-get install -y mosquitto-clients

# The fault-injection tests (tests/python/test_faults.py) need a build with failpoints, which a
# release build never has: a debug build with the `failpoints` feature, copied aside so that
# other debug builds of the binary do not replace it.
FAILPOINTS_BIN := target/debug/switchboard-failpoints
failpoints-build:
	$(CARGO) build --locked -p switchboard --features failpoints
	cp target/debug/switchboard $(FAILPOINTS_BIN)

# The fifteen slowest tests are listed at the end: where the suite's time goes.
python-test: py-deps client-deps mqtt-deps redis-deps failpoints-build
	@$(MAKE) --no-print-directory python-run

python-run:
	SWITCHBOARD_BIN=$(CURDIR)/$(BIN) SWITCHBOARD_FAILPOINTS_BIN=$(CURDIR)/$(FAILPOINTS_BIN) \
		$(PY) -m pytest -q --durations=15 tests/python

node-test: node-deps mqtt-deps
	@$(MAKE) --no-print-directory node-run

node-run:
	cd tests/node && SWITCHBOARD_BIN=$(CURDIR)/$(BIN) node --test

# The TypeScript SDK and the dashboard app (web/, served by the gateway from
# web/dashboard/dist). npm ci runs when node_modules is missing or older than the lock file.
web/node_modules/.package-lock.json: web/package-lock.json
	cd web && npm ci --no-audit --no-fund --loglevel=error

web-deps: web/node_modules/.package-lock.json

web-build: web-deps
	cd web && npm run --silent build

# SDK tests (vitest) against the real server; one file runs it on two real Redis shards.
web-test: web-build build redis-deps
	@$(MAKE) --no-print-directory web-run

web-run:
	cd web && SWITCHBOARD_BIN=$(CURDIR)/$(BIN) npm test --silent

# Browser tests drive Debian's Chromium through playwright-core; never a downloaded browser.
browser-deps:
	@test -x /usr/bin/chromium || apt-get install -y chromium

tests/browser/node_modules/.package-lock.json: tests/browser/package-lock.json
	cd tests/browser && npm ci --no-audit --no-fund --loglevel=error

browser-test: browser-deps web-build build tests/browser/node_modules/.package-lock.json
	@$(MAKE) --no-print-directory browser-run

browser-run:
	cd tests/browser && SWITCHBOARD_BIN=$(CURDIR)/$(BIN) node --test --test-concurrency=1

# Headless-Chromium dashboard benchmark (docs/dashboard.md); WIDGETS=1000 DURATION=30 to narrow.
WIDGETS ?= 100,1000,10000
DURATION ?= 30
bench-dashboard: browser-deps build
	SWITCHBOARD_BIN=$(CURDIR)/$(BIN) node web/bench/dashboard-bench.mjs --widgets $(WIDGETS) \
		--duration $(DURATION) --screenshot docs/img/dashboard-{n}.png

bench: build
	@echo "see docs/benchmarks.md for the commands behind each figure"

clean:
	$(CARGO) clean
	rm -rf $(VENV) tests/node/node_modules web/node_modules web/sdk/dist web/dashboard/dist tests/browser/node_modules
