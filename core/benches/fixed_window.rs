//! `cargo bench -p redis-ratelimit-core --bench fixed_window`: the fixed-window's decision on a stored key
//! (common/rate.rs lists the cases).

mod common;

use redis_ratelimit_core::algorithms::Algorithm;

fn main() {
    let mut bench = common::Bench::new("fixed-window");
    common::rate::cases(&mut bench, Algorithm::FixedWindow);
    bench.finish();
}
