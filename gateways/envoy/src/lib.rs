//! redis-ratelimit-rls: a rate limit service for Envoy (`envoy.service.ratelimit.v3`) that reads
//! envoyproxy/ratelimit's configuration unchanged and decides with the redis-ratelimit module.

pub mod config;
mod yaml_tree;
