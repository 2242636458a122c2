//! The module's pure code, compiled from the module's own source files under the module's crate
//! name, so the fuzz targets read `redis_ratelimit::commands::parse::parse_check` and
//! `redis_ratelimit::store::codec::decode` exactly as with the real crate.
//!
//! Why not a dependency on the crate itself: it links `redis-module`, whose build runs bindgen and
//! compiles its dependency tree again under the fuzzer's instrumentation flags: about five minutes
//! of a cold build on two cores, against about one for this. These modules import nothing but each
//! other and `std` (the cores are kept free of Redis); if one ever needs more, add it here or
//! switch to `redis-ratelimit = { path = ".." }` in Cargo.toml: the targets do not change.
#![allow(dead_code)]

#[path = "../../src/algorithms/mod.rs"]
pub mod algorithms;

#[path = "../../src/error.rs"]
pub mod error;

#[path = "../../src/policy.rs"]
pub mod policy;

#[path = "../../src/integer.rs"]
#[doc(hidden)]
pub mod integer;

#[path = "../../src/commands/parse.rs"]
#[doc(hidden)]
pub mod parse;

#[path = "../../src/store/codec.rs"]
#[doc(hidden)]
pub mod codec;

#[path = "../../src/store/value.rs"]
#[doc(hidden)]
pub mod value;

#[path = "../../src/store/compact.rs"]
#[doc(hidden)]
pub mod compact;

pub mod commands {
    pub use super::parse;
}

pub mod store {
    pub use super::codec;
    pub use super::compact;
    pub use super::value;
}
