//! `cargo bench -p redis-ratelimit-core --bench gcra`: the gcra's decision on a stored key
//! (common/rate.rs lists the cases).

mod common;

use redis_ratelimit_core::algorithms::Algorithm;

fn main() {
    let mut bench = common::Bench::new("gcra");
    common::rate::cases(&mut bench, Algorithm::Gcra);
    bench.finish();
}
