//! `cargo bench -p redis-ratelimit-core --bench token_bucket`: the token-bucket's decision on a stored key
//! (common/rate.rs lists the cases).

mod common;

use redis_ratelimit_core::algorithms::Algorithm;

fn main() {
    let mut bench = common::Bench::new("token-bucket");
    common::rate::cases(&mut bench, Algorithm::TokenBucket);
    bench.finish();
}
