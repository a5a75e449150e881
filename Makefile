# nodup — two entry points: `make demo` (the main job) and `make test` (every test).
# Both install what they need on a fresh Debian machine (you are root there).

CARGO ?= cargo
SHELL := /bin/bash

.PHONY: all build release deps test lint unit demo torture bench clean trace-check fs-pjdfstest fs-fsx

all: build

build:
	$(CARGO) build --workspace

release:
	$(CARGO) build --release --workspace

# System packages the mount, demo and tests need; installed only when missing.
deps:
	@bash scripts/deps.sh

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

unit:
	$(CARGO) test --workspace --release

test: deps lint unit trace-check fs-pjdfstest fs-fsx torture-quick
	@echo "make test: all suites passed"

# Trace tools acceptance: independent dedup-ratio script, convert round trip, replay hashes (issue 4).
trace-check:
	@bash scripts/trace-check.sh

# External file-system suites against a real nodup FUSE mount (issue 3).
fs-pjdfstest: deps release
	@bash scripts/fs-pjdfstest.sh

fs-fsx: deps release
	@bash scripts/fs-fsx.sh

demo: deps release
	@bash scripts/demo.sh

clean:
	$(CARGO) clean

# Reliability (issue 5): every campaign with the budget TORTURE_SECONDS; summary lines at the end.
.PHONY: torture-quick
torture: deps
	@TORTURE_SECONDS=$${TORTURE_SECONDS:-7200} bash scripts/torture.sh

# Reduced reliability run (part of make test, under 5 minutes).
torture-quick: deps
	@bash scripts/torture-quick.sh
