//! The integration tests: black-box tests of the module through real clients against real
//! `redis-server` processes, one module per concern, all in one test crate (one binary to build
//! and link instead of one per file).
//!
//! `common` is the test kit (the crate `testkit/`, shared with benches/compare: servers on free
//! loopback ports, killed on Drop; calls and replies; a seeded generator; the model of stored
//! keys). Run one concern with a filter, e.g.
//! `cargo test --test integration checkall::`; `make test` runs them all and prints one total.

use redis_ratelimit_testkit as common;

mod block;
mod checkall;
mod cluster;
mod commands;
mod compact;
mod compat;
mod contention;
mod dialects;
mod equivalence;
mod examples;
mod formats;
mod functions;
mod gateways;
mod harness;
mod hostile_input;
mod invisible;
mod leases;
mod memcheck;
mod memory;
mod module_configs;
mod one_argument_spec;
mod operations;
mod persistence;
mod policies;
mod refund;
mod snippets;
mod take;
mod time;
mod vectors;
