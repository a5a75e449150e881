# nodup — two entry points: `make demo` (the main job) and `make test` (every test).
# Both install what they need on a fresh Debian machine (you are root there).

CARGO ?= cargo
# Where cargo puts what it builds.
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)
SHELL := /bin/bash

.PHONY: all build release deps test lint unit examples demo torture bench bench-full clean trace-check fs-pjdfstest fs-fsx install install-check

# Where `make install` puts things (DESTDIR for staging). mount(8) looks for helpers in /sbin.
PREFIX ?= /usr/local
SBINDIR ?= /sbin
DESTDIR ?=

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

# The library's embedded uses, run as a user would (each checks its own results). Built for
# the whole workspace, as `unit` built them (with the dev-dependencies' features), so after
# `unit` nothing recompiles; `cargo run -p` resolved features per package and rebuilt the
# libraries twice (95 s of a CI run).
examples:
	$(CARGO) build --release -q --workspace --examples
	$(TARGET_DIR)/release/examples/block_store
	$(TARGET_DIR)/release/examples/embedded_fs

test: deps lint unit examples trace-check fs-pjdfstest fs-fsx install-check torture-quick
	@echo "make test: all suites passed"

# The binary, its man pages (generated from the CLI definition) and the mount(8) helper, so
# `mount -t fuse.nodup IMAGE DIR` and /etc/fstab lines work.
install: release
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(SBINDIR)
	install -m 755 target/release/nodup $(DESTDIR)$(PREFIX)/bin/nodup
	target/release/nodup man $(DESTDIR)$(PREFIX)/share/man/man1
	ln -sf $(PREFIX)/bin/nodup $(DESTDIR)$(SBINDIR)/mount.fuse.nodup
	@echo "installed nodup in $(DESTDIR)$(PREFIX)/bin, man pages, and $(DESTDIR)$(SBINDIR)/mount.fuse.nodup"

# make install into a staging directory, then mount through mount(8) and an fstab line.
install-check: deps release
	@bash scripts/install-check.sh

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

# The side-by-side benchmark suite (issue 21; not part of `make test`): quick sizes, and
# paper-scale ones. Results go to docs/results/.
bench: deps release
	@bash bench/suite.sh

bench-full: deps release
	@FULL=1 bash bench/suite.sh
