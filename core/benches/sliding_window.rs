//! `cargo bench -p redis-ratelimit-core --bench sliding_window`: the sliding-window's decision on a stored key
//! (common/rate.rs lists the cases).

mod common;

use redis_ratelimit_core::algorithms::Algorithm;

fn main() {
    let mut bench = common::Bench::new("sliding-window");
    common::rate::cases(&mut bench, Algorithm::SlidingWindow);
    bench.finish();
}
