//! redis-ratelimit: native rate limiting inside Redis.
pub mod algorithms;
