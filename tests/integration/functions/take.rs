//! `ratelimit_take` against `RATELIMIT.TAKE`: on twin keys (`n:` the module's, `f:` the
//! library's) random sequences of TAKE and CHECK with `AT`, every algorithm, BLOCK now and then,
//! get the same replies, the same PEXPIRETIME after every call and the same INFO; bad arguments
//! get the module's errors.

use super::engines::{
    assert_same_error, both_engines, both_infos, fcall, native, same_info, same_reply, seed, words,
};
use crate::common::rng::Rng;
use crate::common::{future_base_ms, pexpiretime, send, show_value};
use redis_ratelimit_core::algorithms::Algorithm;

#[test]
fn take_answers_and_stores_as_the_modules() {
    let (_server, mut con) = both_engines();
    let mut rng = Rng::with_stream(seed(), 35);
    let base = future_base_ms();
    let mut partial = 0;
    for round in 0..30 {
        let algorithm = Algorithm::ALL[round % Algorithm::ALL.len()].name();
        let limit = rng.range(1, 9);
        let period_ms = rng.pick(&[100u64, 1000, 7000]);
        let mut spec = vec![
            algorithm.to_string(),
            limit.to_string(),
            format!("{period_ms}ms"),
        ];
        if (algorithm.ends_with("bucket") || algorithm == "gcra") && rng.chance(50) {
            spec.extend(["BURST".to_string(), rng.range(1, 12).to_string()]);
        }
        if rng.chance(25) {
            spec.extend(["BLOCK".to_string(), "1500ms".to_string()]);
        }
        let (nkey, fkey) = (format!("n:{round}"), format!("f:{round}"));
        let mut at = base + rng.below(1000);
        for step in 0..40 {
            at = if rng.chance(10) {
                at - rng.below(period_ms)
            } else {
                at + rng.below(period_ms / 2 + 1)
            };
            let mut args = spec.clone();
            let (command, n) = if rng.chance(25) {
                ("check", rng.below(limit + 13))
            } else {
                ("take", rng.range(1, limit + 13))
            };
            args.extend([
                if command == "take" { "MAX" } else { "COST" }.to_string(),
                n.to_string(),
                "AT".to_string(),
                at.to_string(),
            ]);
            let replies = send(
                &mut con,
                &[
                    native(command, &[&nkey], &args),
                    fcall(command, &[&fkey], &args),
                ],
            );
            let what = format!("round {round}, step {step}: {command} {}", args.join(" "));
            assert!(
                same_reply(&replies[0], &replies[1]),
                "{what}: module {}, library {}",
                show_value(&replies[0]),
                show_value(&replies[1])
            );
            if command == "take" {
                let granted = crate::common::reply6(&replies[0])[0];
                if granted > 0 && (granted as u64) < n {
                    partial += 1;
                }
            }
            assert_eq!(
                pexpiretime(&mut con, &nkey),
                pexpiretime(&mut con, &fkey),
                "{what}: PEXPIRETIME"
            );
        }
        let (module, library) = both_infos(&mut con, &nkey, &fkey);
        assert!(same_info(&module, &library), "round {round}: INFO");
    }
    assert!(partial >= 30, "{partial} partial grants");
}

#[test]
fn take_refuses_bad_arguments_with_the_modules_errors() {
    let (_server, mut con) = both_engines();
    for line in [
        "",
        "fixed-window 5 1s",
        "fixed-window 5 1s MAX 0",
        "fixed-window 5 1s MAX 1000000000001",
        "fixed-window 5 1s MAX x",
        "fixed-window 5 1s MAX",
        "fixed-window 5 1s MAX 1 max 2",
        "fixed-window 5 1s COST 1",
        "fixed-window 5 1s cost 1 MAX 2",
        "fixed-window 5 1s MAX 2 LIMIT 3",
        "fixed-window 5 1 seconds MAX 1",
        "fixed-window 0 1s MAX 1",
        "fixed-window 5 1s BURST 2 MAX 1",
        "token-bucket 5 1s BURST 0 MAX 1",
        "token-bucket 5 1s MAX 1 AT x",
        "token-bucket 5 1s BLOCK x MAX 1",
        "sliding-logs 5 1s MAX 1",
        "concurrency 5 1s MAX 1",
    ] {
        let args = words(line);
        assert_same_error(
            &mut con,
            native("take", &["k"], &args),
            fcall("take", &["k"], &args),
            &format!("take k {line}"),
        );
    }
}
