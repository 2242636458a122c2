# redis-ratelimit: build, run and test the native Redis rate-limiting module.
# `make help` lists the targets; each one documents itself with a `## ` comment.

SHELL := bash
.DEFAULT_GOAL := help

# Port for `make run` (`make run PORT=6380`).
PORT ?= 6379
# The module library cargo builds, and where `make run` keeps its RDB/AOF files (see redis.conf).
MODULE := $(CURDIR)/target/release/libredis_ratelimit.so
DATA_DIR := target/redis-data

# Debian packages the build and the tests need: redis-server and redis-cli to run the module,
# libclang-dev for the bindgen step of the redis-module crate.
APT_GET := $(if $(filter 0,$(shell id -u)),,sudo) env DEBIAN_FRONTEND=noninteractive apt-get

# How long `make fuzz` runs each target, in seconds.
FUZZ_SECONDS ?= 20

.PHONY: help deps build run test test-python test-node examples fuzz lint fmt clean bench bench-clients bench-gateways profile memcheck test-matrix dist-deps dist test-dist

help: ## List the targets
	@awk 'BEGIN { FS = ":.*## " } /^[a-zA-Z_-]+:.*## / { printf "  %-15s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

deps: ## Install redis-server, redis-tools and libclang-dev with apt-get (only what is missing)
	@missing=""; \
	command -v redis-server >/dev/null 2>&1 || missing+=" redis-server"; \
	command -v redis-cli >/dev/null 2>&1 || missing+=" redis-tools"; \
	dpkg -s libclang-dev >/dev/null 2>&1 || compgen -G '/usr/lib/llvm-*/lib/libclang.so*' >/dev/null \
		|| missing+=" libclang-dev"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		$(APT_GET) update && $(APT_GET) install -y $$missing; \
	fi

build: deps ## Build the module (target/release/libredis_ratelimit.so)
	cargo build --release

run: build ## Start redis-server in the foreground with redis.conf and the module (PORT=6379)
	@if (exec 3<>/dev/tcp/127.0.0.1/$(PORT)) 2>/dev/null; then \
		echo "port $(PORT) is already in use; try make run PORT=$$(( $(PORT) + 1 ))" >&2; exit 1; \
	fi
	mkdir -p $(DATA_DIR)
	redis-server redis.conf --port $(PORT)

# The module before a limit spec could be one argument (CHECK's arity -4), built once under
# target/older-module for the Rust client's test of a server that refuses that form.
OLDER_MODULE_REV := 94a0a9b4e1febff0de32f297d516f4b907453f8a

test: export RATELIMIT_MODULE := $(MODULE)
test: export RATELIMIT_SKIP_LOG := $(CURDIR)/target/test-skips.log
# Most integration tests wait on their servers, not on a core: four at a time on two cores takes
# two thirds of the time (RUST_TEST_THREADS=... to choose).
test: export RUST_TEST_THREADS := $(or $(RUST_TEST_THREADS),4)
test: build ## Every test: the core's unit and property tests, the module's, integration against real servers, the examples, then the Python and Node packages' (~6 min fresh, ~4 min after); ends with `N passed, N failed, N skipped`
	@rm -f $(RATELIMIT_SKIP_LOG)
	@older=$$(bash tests/older-module.sh $(OLDER_MODULE_REV) $(CURDIR)/target/older-module) || exit 1; \
	if [ -n "$$older" ]; then export RATELIMIT_OLD_MODULE=$$older; fi; \
	set -o pipefail; cargo test --profile tests --workspace --no-fail-fast 2>&1 | tee target/test.log; status=$$?; \
	bash clients/python/test.sh 2>&1 | tee target/test-python.log; pystatus=$$?; \
	bash clients/node/scripts/test.sh $(CURDIR)/target/test-node.tap; node_status=$$?; \
	bash tests/summary.sh target/test.log $(RATELIMIT_SKIP_LOG) $$status target/test-python.log $$pystatus \
		target/test-node.tap $$node_status; \
	exit $$(( status || pystatus || node_status ))

test-python: export RATELIMIT_MODULE := $(or $(RATELIMIT_MODULE),$(MODULE))
test-python: ## The Python package (clients/python): build the wheel, install it into a fresh venv under target/python, pytest it against real servers, with redis-py 8 and 5 (~1 to 2 min)
	@test -f "$$RATELIMIT_MODULE" || $(MAKE) build
	bash clients/python/test.sh

test-node: export RATELIMIT_MODULE := $(or $(RATELIMIT_MODULE),$(MODULE))
test-node: ## The Node package (clients/node): npm ci, build, npm pack, node --test against real servers (~1 min)
	@test -f "$$RATELIMIT_MODULE" || $(MAKE) build
	@bash clients/node/scripts/test.sh $(CURDIR)/target/test-node.tap; status=$$?; \
	bash tests/summary.sh /dev/null /dev/null 0 "" 0 target/test-node.tap $$status; exit $$status

examples: export RATELIMIT_MODULE := $(MODULE)
examples: build ## Only the tests of examples/ (FastAPI, Express, Prometheus; make test runs them too)
	cargo test --profile tests --test integration -- examples::

fuzz: ## Fuzz the argument parsers and the codec for FUZZ_SECONDS each (installs cargo-fuzz once)
	FUZZ_SECONDS=$(FUZZ_SECONDS) bash fuzz/run.sh

test-matrix: export RATELIMIT_MODULE := $(MODULE)
test-matrix: build ## The integration suites once per server found (Redis 7.0-8.0, Valkey 8); a table
	bash tests/matrix.sh

bench: export RATELIMIT_MODULE := $(MODULE)
bench: build ## The core's own speed per algorithm, then module vs Lua scripts, library, SET PXAT, INCR, redis-cell; a replica; RESP3; then bench-clients (~7 min; BENCH_QUICK=1: ~3); see target/bench/
	@mkdir -p target/bench
	set -o pipefail; cargo bench -p redis-ratelimit-core | tee target/bench/core.md
	cargo bench --config profile.bench.opt-level=3 --bench compare
	@if [ -z "$$BENCH_ONLY" ]; then $(MAKE) --no-print-directory bench-clients bench-gateways; fi

bench-gateways: export RATELIMIT_MODULE := $(MODULE)
bench-gateways: build ## NGINX and HAProxy serving a static page: without a limiter, with this one, with their own (limit_req, a stick table), under wrk at 16 and 64 connections (~5 min): a table of requests/s and latency
	bash gateways/bench.sh

bench-clients: export RATELIMIT_MODULE := $(MODULE)
bench-clients: build ## The Node package's batches on one hot key and denial cache under a flood, each beside per-request CHECKs; the Node, Python and Rust clients' cost per call beside the raw clients (~7 min; BENCH_QUICK=1: ~2 min); see target/bench/clients/
	bash clients/node/scripts/prepare.sh
	node benches/clients/decisions.mjs
	node benches/clients/overhead.mjs
	@test -x target/python/venv/bin/python || PYTEST_ARGS="-q -k wheel" bash clients/python/test.sh
	target/python/venv/bin/python benches/clients/overhead.py
	cargo run --quiet --release -p redis-ratelimit-client --example overhead

profile: export RATELIMIT_MODULE := $(MODULE)
profile: build ## Instructions per call (callgrind) vs SET PXAT, INCR, redis-cell; a replica; RESP3; keys in a word; a policy; then Redis's instructions per Envoy request vs envoyproxy/ratelimit's INCRBY+EXPIRE (~25 min); see target/bench/profile/ and target/bench/rls-profile/
	@command -v valgrind >/dev/null 2>&1 || { $(APT_GET) update && $(APT_GET) install -y valgrind; }
	bash benches/profile.sh
	bash gateways/envoy/bench/profile.sh

memcheck: export RATELIMIT_MODULE := $(MODULE)
memcheck: build ## Every command under valgrind memcheck (~1 min); fails on memory errors in the module; see target/memcheck/
	@command -v valgrind >/dev/null 2>&1 || { $(APT_GET) update && $(APT_GET) install -y valgrind; }
	bash tests/memcheck.sh

# What `make dist` and `make test-dist` need from Debian beyond `make deps`: dpkg-shlibdeps (dpkg-dev)
# for the package's Depends, objcopy and strip (binutils), debootstrap for the Debian 11 root, and
# lintian. Only what is missing is installed.
dist-deps:
	@missing=""; \
	command -v dpkg-shlibdeps >/dev/null 2>&1 || missing+=" dpkg-dev"; \
	command -v fakeroot >/dev/null 2>&1 || missing+=" fakeroot"; \
	command -v objcopy >/dev/null 2>&1 || missing+=" binutils"; \
	if [ "$(DIST_TEST_DEPS)" = 1 ]; then \
		command -v debootstrap >/dev/null 2>&1 || missing+=" debootstrap"; \
		command -v lintian >/dev/null 2>&1 || missing+=" lintian"; \
	fi; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		$(APT_GET) update -qq && $(APT_GET) install -y -qq $$missing >/dev/null \
			|| echo "dist-deps: could not install$$missing; what needs it says so" >&2; \
	fi

dist: deps dist-deps ## Release files in dist/: the module and redis-ratelimit-rls for glibc 2.17 (tarball, -debug tarball), their .debs, the client packages, SHA256SUMS (~5 to 10 min fresh)
	bash packaging/dist.sh

test-dist: export DIST_TEST_DEPS := 1
test-dist: deps dist-deps ## Build dist/ and prove it: glibc floor, suites on every server, the service, Debian 11 root, .deb install/purge, lintian, reproducible (~10 min fresh, ~8 after)
	bash packaging/test-dist.sh

.PHONY: functions functions-payload functions-bench functions-instructions

functions: functions-payload ## Assemble the Redis Functions library, then load it (no module needed) into a running server (PORT=6379)
	redis-cli -p $(PORT) -x FUNCTION LOAD REPLACE < lua-reference/functions/ratelimit.lua

functions-payload: ## Assemble lua-reference/functions/ratelimit.lua from its parts (lua-reference/functions/src/) and the module's error texts
	python3 lua-reference/functions/assemble.py

functions-bench: ## Functions library vs Lua scripts (and the module, if loaded) on a running server (PORT=6379)
	bash lua-reference/functions/bench.sh $(PORT)

functions-instructions: ## Instructions per call of the Functions library vs the Lua scripts, under callgrind (~3 min)
	@command -v valgrind >/dev/null 2>&1 || { $(APT_GET) update && $(APT_GET) install -y valgrind; }
	bash lua-reference/functions/instructions.sh

lint: deps ## Check formatting, clippy (every unsafe block with a SAFETY comment, tests too) and rustdoc over the workspace (module, core, test kit) and fuzz/, and the Lua (luacheck), with warnings as errors
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -W clippy::undocumented_unsafe_blocks -D warnings
	RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --document-private-items
	# The fuzz targets use the core's internals: they must build whenever the core changes.
	cargo fmt --manifest-path fuzz/Cargo.toml --all --check
	cargo clippy --manifest-path fuzz/Cargo.toml --bins -- -D warnings
	# The Functions library: the committed payload is what its parts assemble to, and the Lua of
	# lua-reference/ (that payload and the reference scripts) passes luacheck (.luacheckrc).
	python3 lua-reference/functions/assemble.py --check
	@command -v luacheck >/dev/null 2>&1 || { $(APT_GET) update && $(APT_GET) install -y lua-check; }
	luacheck --no-color lua-reference/
	# The gateways' Lua (NGINX, HAProxy and their shared core), under their own globals.
	luacheck --no-color --config gateways/.luacheckrc gateways/
	# Comments name only paths that exist in the repository.
	bash tests/lint-paths.sh
	# The Python package: ruff check, ruff format --check, mypy --strict (tools pinned, in target/python-lint).
	bash clients/python/lint.sh
	# The Node package: tsc --noEmit (strict) and eslint with typescript-eslint's type-checked rules.
	bash clients/node/scripts/lint.sh

fmt: ## Format the code (the workspace and fuzz/)
	cargo fmt --all
	cargo fmt --manifest-path fuzz/Cargo.toml --all

clean: ## Remove build output and the data of `make run`
	cargo clean
