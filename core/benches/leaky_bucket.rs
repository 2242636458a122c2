//! `cargo bench -p redis-ratelimit-core --bench leaky_bucket`: the leaky-bucket's decision on a stored key
//! (common/rate.rs lists the cases).

mod common;

use redis_ratelimit_core::algorithms::Algorithm;

fn main() {
    let mut bench = common::Bench::new("leaky-bucket");
    common::rate::cases(&mut bench, Algorithm::LeakyBucket);
    bench.finish();
}
