//! The cases every rate algorithm is measured in: `algorithms::check`, the call a CHECK makes
//! once the key is open and the arguments parsed, on a stored limiter in its 32-byte form.

use redis_ratelimit_core::algorithms::{check, Algorithm, Limiter, Params, Request, Write};

use super::Bench;

/// The time of the first call (2027-01-15, a multiple of an hour).
pub const T0: u64 = 1_800_000_000_000;

/// A call of cost 1 at `now_ms`; the buckets' burst is the limit.
pub fn request(algorithm: Algorithm, limit: u64, period_ms: u64, now_ms: u64) -> Request {
    Request {
        algorithm,
        params: Params::new(limit, period_ms, None).expect("valid parameters"),
        cost: 1,
        now_ms,
    }
}

/// Decides `request` on `stored` (writing when `commit`): whether it was admitted.
pub fn admitted(stored: Option<&mut Limiter>, request: &Request, commit: bool) -> bool {
    check(stored, request, commit, &mut None)
        .expect("the key holds the algorithm")
        .0
        .decision
        .allowed
}

/// The key an admitted first call creates.
pub fn created(request: &Request) -> Limiter {
    let mut created = None;
    match (check(None, request, true, &mut created), created) {
        (Ok((outcome, Write::Created)), Some(limiter)) if outcome.decision.allowed => limiter,
        other => panic!("a first call creates its key: {other:?}"),
    }
}

/// The cases of every rate algorithm:
/// - consuming calls on a live key, one a millisecond, with the parameters of `make bench`'s
///   consuming cases scaled up (10^12 per 60,000,000,000 ms) so that no call in any round is
///   rejected (not for the sliding log, whose log would grow by an entry a call: its own bench
///   measures it at a fixed size);
/// - a common limit (100 an hour) called at half its pace, a call every 72 s: refills, window
///   changes and the log's slide on every call, every call admitted;
/// - rejected calls on an exhausted key (limit 1);
/// - a first call, creating the state to store;
/// - a PEEK (nothing written) of the common limit's key.
pub fn cases(bench: &mut Bench, algorithm: Algorithm) {
    if algorithm != Algorithm::SlidingLog {
        let call = request(algorithm, 1_000_000_000_000, 60_000_000_000, T0);
        let mut key = (created(&call), call);
        bench.case(
            "consuming, a live key, 10^12 per 60,000,000,000 ms",
            &mut key,
            true,
            |(limiter, call)| {
                call.now_ms += 1;
                admitted(Some(limiter), call, true)
            },
        );
    }
    let call = request(algorithm, 100, 3_600_000, T0);
    let mut key = (created(&call), call);
    bench.case(
        "consuming, 100 an hour, a call every 72 s",
        &mut key,
        true,
        |(limiter, call)| {
            call.now_ms += 72_000;
            admitted(Some(limiter), call, true)
        },
    );
    let (limiter, call) = &mut key;
    let mut peeked = (limiter.clone(), *call);
    bench.case(
        "PEEK, 100 an hour (nothing written)",
        &mut peeked,
        true,
        |(limiter, call)| admitted(Some(limiter), call, false),
    );
    let call = request(algorithm, 1, 60_000_000_000, T0);
    let mut key = (created(&call), call);
    bench.case(
        "rejected, an exhausted key (limit 1)",
        &mut key,
        false,
        |(limiter, call)| admitted(Some(limiter), call, true),
    );
    let mut call = request(algorithm, 100, 3_600_000, T0);
    bench.case("a new key (the state to store)", &mut call, true, |call| {
        let mut created = None;
        match check(None, call, true, &mut created) {
            Ok((outcome, Write::Created)) => {
                drop(std::hint::black_box(created));
                outcome.decision.allowed
            }
            _ => false,
        }
    });
}
