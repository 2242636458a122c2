//! redis-ratelimit-rls: a rate limit service for Envoy (`envoy.service.ratelimit.v3`) that reads
//! envoyproxy/ratelimit's configuration unchanged and decides with the redis-ratelimit module
//! (`RATELIMIT.CHECKALL`, `RATELIMIT.CHECK`). See gateways/envoy/README.md.

pub mod backend;
pub mod config;
pub mod json;
pub mod log;
pub mod server;
pub mod service;
pub mod settings;
pub mod stats;
mod yaml_tree;

pub use envoy_types;
