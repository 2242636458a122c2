//! Distributed rate limiting over Redis for tokio services: the
//! [redis-ratelimit](https://github.com/) module's `RATELIMIT.*` commands, or its Functions
//! library where the module cannot load, through [redis-rs](https://docs.rs/redis).
//!
//! ```ignore
//! use redis_ratelimit_client::{Algorithm, Limit, Options, RateLimiter};
//!
//! let conn = redis::Client::open("redis://127.0.0.1/")?.get_connection_manager().await?;
//! let limiter = RateLimiter::new(conn, Options::default())?;
//! let limit = Limit::new(Algorithm::TokenBucket, 10, "1s")?.burst(20)?;
//! let d = limiter.check("user:42", &limit, 1).await?;
//! if !d.allowed { /* 429, Retry-After: d.retry_after_ms */ }
//! ```
//!
//! - [`types`]: [`Limit`], [`Policy`], [`Decision`], [`Error`];
//! - [`wire`]: the commands' arguments and replies (RESP2 and RESP3) read into typed results;
//! - [`engine`]: the sans-IO part: engines, policies, the breaker, [`Options`], [`OnError`];
//! - [`clientside`]: the denial cache and the batches;
//! - [`local`]: the local fallback, on the core crate's own algorithms;
//! - `tower` (feature `tower`): `RateLimitLayer`, a tower layer for HTTP services.
//!
//! The README has the guide: engines, failure modes, client-side decisions and their bound.

pub mod clientside;
pub mod connection;
pub mod engine;
mod limiter;
pub mod local;
#[cfg(feature = "tower")]
pub mod tower;
pub mod types;
pub mod wire;

pub use connection::Connection;
pub use engine::{EngineChoice, OnError, Options};
pub use limiter::{Lease, Policies, PolicyDefinition, RateLimiter, LIBRARY_CODE};
pub use types::{
    Algorithm, Call, Decision, Error, Limit, LimitSpec, MultiDecision, Period, Policy, Source,
    Spec, SpecRef,
};
