//! Module configuration: `ratelimit.*` configs through Redis 7's module config API.
//!
//! Each config lives in an atomic read on the hot path (no lock, no allocation). Redis owns the
//! rest: `CONFIG GET/SET ratelimit.<name>`, `ratelimit.<name> value` lines in redis.conf (and
//! `--ratelimit.<name> value` on the command line), `MODULE LOADEX ... CONFIG`, and
//! `CONFIG REWRITE`. Load arguments (`loadmodule <path> <name> <value> ...`) set a config's
//! initial value; an explicit `ratelimit.<name>` directive wins over them.
//!
//! One load argument is no config: `dialects`, which commands of other front ends the module
//! registers beside its own (`none`, `all`, or names separated by commas; all by default). It is
//! read once, at load, and lives nowhere after that: the commands are registered or not.
//!
//! Every value is validated against the config's bounds: Redis refuses an out-of-range or
//! non-integer `CONFIG SET` with an error, and a bad value at load time (a load argument or a
//! directive) makes the module, and so a starting server, refuse to load.

use std::ffi::{c_int, c_longlong, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};

use redis_module::raw;

use crate::api::{has, rm};

/// The prefix Redis gives the module's configs (the module's name and a dot).
pub const PREFIX: &str = "ratelimit.";

/// Default `ratelimit.max-log-limit`: the largest limit a sliding log accepts.
pub const DEFAULT_MAX_LOG_LIMIT: i64 = 100_000;
/// Bounds of `ratelimit.max-log-limit`. A sliding log costs at most 6 bytes per entry (a gap of
/// 3650 days; 1 to 3 bytes for gaps under 17 minutes, and entries at the same millisecond share a
/// record), so the upper bound caps one key at about 75 MB with the room it grows into.
pub const MIN_MAX_LOG_LIMIT: i64 = 1;
pub const MAX_MAX_LOG_LIMIT: i64 = 10_000_000;

/// `ratelimit.max-log-limit`.
pub static MAX_LOG_LIMIT: AtomicI64 = AtomicI64::new(DEFAULT_MAX_LOG_LIMIT);

/// The current `ratelimit.max-log-limit`.
pub fn max_log_limit() -> u64 {
    MAX_LOG_LIMIT.load(Relaxed).max(1) as u64
}

/// Default `ratelimit.max-policies`: how many policies `RATELIMIT.POLICY SET` may define.
pub const DEFAULT_MAX_POLICIES: i64 = 10_000;
/// Bounds of `ratelimit.max-policies` (0: no policy can be defined).
pub const MIN_MAX_POLICIES: i64 = 0;
pub const MAX_MAX_POLICIES: i64 = 1_000_000;

/// `ratelimit.max-policies`.
pub static MAX_POLICIES: AtomicI64 = AtomicI64::new(DEFAULT_MAX_POLICIES);

/// The current `ratelimit.max-policies`.
pub fn max_policies() -> u64 {
    MAX_POLICIES.load(Relaxed).max(0) as u64
}

/// Default `ratelimit.max-leases`: the most live leases one concurrency key may hold.
pub const DEFAULT_MAX_LEASES: i64 = 100_000;
/// Bounds of `ratelimit.max-leases`. A lease costs at most its id and 24 bytes beyond a header of
/// at most 6,900 bytes (docs/operations.md), so the upper bound caps one key at 152 MB with
/// 128-byte ids.
pub const MIN_MAX_LEASES: i64 = 1;
pub const MAX_MAX_LEASES: i64 = 1_000_000;

/// `ratelimit.max-leases`.
pub static MAX_LEASES: AtomicI64 = AtomicI64::new(DEFAULT_MAX_LEASES);

/// The current `ratelimit.max-leases`.
pub fn max_leases() -> u64 {
    MAX_LEASES.load(Relaxed).max(1) as u64
}

/// One integer config.
pub struct NumericConfig {
    /// The name without the module prefix, as registered (`max-log-limit`).
    pub name: &'static CStr,
    pub default: i64,
    pub min: i64,
    pub max: i64,
    pub value: &'static AtomicI64,
}

/// How many configs the module registers.
pub const COUNT: usize = 3;

/// Every config the module registers.
pub static NUMERIC: [NumericConfig; COUNT] = [
    NumericConfig {
        name: c"max-log-limit",
        default: DEFAULT_MAX_LOG_LIMIT,
        min: MIN_MAX_LOG_LIMIT,
        max: MAX_MAX_LOG_LIMIT,
        value: &MAX_LOG_LIMIT,
    },
    NumericConfig {
        name: c"max-policies",
        default: DEFAULT_MAX_POLICIES,
        min: MIN_MAX_POLICIES,
        max: MAX_MAX_POLICIES,
        value: &MAX_POLICIES,
    },
    NumericConfig {
        name: c"max-leases",
        default: DEFAULT_MAX_LEASES,
        min: MIN_MAX_LEASES,
        max: MAX_MAX_LEASES,
        value: &MAX_LEASES,
    },
];

impl NumericConfig {
    fn short_name(&self) -> &'static str {
        self.name.to_str().unwrap_or("?")
    }

    /// Why `value` is refused, if it is.
    fn check(&self, value: i64) -> Result<(), String> {
        if (self.min..=self.max).contains(&value) {
            Ok(())
        } else {
            Err(self.out_of_range())
        }
    }

    fn out_of_range(&self) -> String {
        format!(
            "{PREFIX}{} must be an integer from {} to {}",
            self.short_name(),
            self.min,
            self.max
        )
    }
}

/// The config a load argument or directive names, with or without the `ratelimit.` prefix,
/// case-insensitively (as Redis treats config names).
fn find(name: &[u8]) -> Option<usize> {
    let prefix = PREFIX.as_bytes();
    let short = if name.len() > prefix.len() && name[..prefix.len()].eq_ignore_ascii_case(prefix) {
        &name[prefix.len()..]
    } else {
        name
    };
    NUMERIC
        .iter()
        .position(|config| config.name.to_bytes().eq_ignore_ascii_case(short))
}

/// A plain decimal integer, by the same rules as every numeric argument of the commands.
fn parse_integer(text: &[u8]) -> Option<i64> {
    redis_ratelimit_core::integer::parse_integer(text).and_then(|value| i64::try_from(value).ok())
}

/// The load argument that chooses the dialects.
const DIALECTS: &str = "dialects";

/// What the load arguments ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadArgs {
    /// The initial value of every config in [`NUMERIC`].
    pub numeric: [i64; COUNT],
    /// For each dialect name [`initial_values`] was given, in its order: register it.
    pub dialects: Vec<bool>,
}

/// Which of `names` (the dialect commands, lower-case) a `dialects` value asks for: `none`,
/// `all`, or names separated by commas, case-insensitively.
fn parse_dialects(text: &[u8], names: &[&str]) -> Result<Vec<bool>, String> {
    let expected = || {
        format!(
            "expected none, all, or one or more of {} separated by commas",
            names.join(", ")
        )
    };
    let mut wanted = vec![false; names.len()];
    for item in text.split(|&byte| byte == b',') {
        let item = String::from_utf8_lossy(item).to_ascii_lowercase();
        match item.as_str() {
            "all" | "none" if text.len() != item.len() => {
                return Err(format!("'{item}' stands alone; {}", expected()))
            }
            "all" => wanted.fill(true),
            "none" => {}
            _ => match names.iter().position(|name| *name == item) {
                Some(index) => wanted[index] = true,
                None => return Err(format!("unknown dialect '{item}'; {}", expected())),
            },
        }
    }
    Ok(wanted)
}

/// The module's load arguments, `name value` pairs with each name at most once: the initial
/// value of every config in [`NUMERIC`] (its default unless an argument sets it), and which of
/// the dialect commands `dialects` (their names) to register (all unless `dialects` says
/// otherwise). The error says which argument is wrong and why.
pub fn initial_values(args: &[&[u8]], dialects: &[&str]) -> Result<LoadArgs, String> {
    let mut values = [0; COUNT];
    for (value, config) in values.iter_mut().zip(&NUMERIC) {
        *value = config.default;
    }
    let mut wanted = None;
    let mut given = [false; COUNT];
    for pair in args.chunks(2) {
        let name = String::from_utf8_lossy(pair[0]);
        let is_dialects = pair[0].eq_ignore_ascii_case(DIALECTS.as_bytes());
        let index = find(pair[0]);
        if index.is_none() && !is_dialects {
            let known: Vec<&str> = NUMERIC
                .iter()
                .map(NumericConfig::short_name)
                .chain([DIALECTS])
                .collect();
            return Err(format!(
                "unknown load argument '{name}' (expected name/value pairs; known names: {})",
                known.join(", ")
            ));
        }
        let Some(&text) = pair.get(1) else {
            return Err(format!("load argument '{name}' has no value"));
        };
        let Some(index) = index else {
            if wanted.is_some() {
                return Err(format!("load argument '{name}' given more than once"));
            }
            let parsed = parse_dialects(text, dialects).map_err(|why| {
                format!(
                    "load argument '{name}': '{}' refused: {why}",
                    String::from_utf8_lossy(text)
                )
            })?;
            wanted = Some(parsed);
            continue;
        };
        let config = &NUMERIC[index];
        if given[index] {
            return Err(format!("load argument '{name}' given more than once"));
        }
        given[index] = true;
        let value = parse_integer(text)
            .ok_or_else(|| config.out_of_range())
            .and_then(|value| config.check(value).map(|()| value))
            .map_err(|why| {
                format!(
                    "load argument '{name}': '{}' refused: {why}",
                    String::from_utf8_lossy(text)
                )
            })?;
        values[index] = value;
    }
    Ok(LoadArgs {
        numeric: values,
        dialects: wanted.unwrap_or_else(|| vec![true; dialects.len()]),
    })
}

/// Sets the configs up at load time: the load arguments (`name value` pairs) give their initial
/// values, then [`register`] has Redis apply the directives. Answers which of the `dialects`
/// (their command names) to register; the error says why the module must refuse to load.
pub fn load(
    ctx: *mut raw::RedisModuleCtx,
    args: &[redis_module::RedisString],
    dialects: &[&str],
) -> Result<Vec<bool>, String> {
    catch_unwind(AssertUnwindSafe(|| {
        let args: Vec<&[u8]> = args.iter().map(|arg| arg.as_slice()).collect();
        let initial = initial_values(&args, dialects)?;
        register(ctx, &initial.numeric)?;
        Ok(initial.dialects)
    }))
    .unwrap_or_else(|_| Err("setting up the module configs failed".into()))
}

/// Registers every config with `initial` as its default, then has Redis apply the
/// `ratelimit.*` directives (redis.conf, command line, `MODULE LOADEX ... CONFIG`). Called once
/// from OnLoad; an error (already logged by Redis when a directive is bad) must fail the load.
fn register(ctx: *mut raw::RedisModuleCtx, initial: &[i64; COUNT]) -> Result<(), String> {
    if !has!(RedisModule_RegisterNumericConfig) || !has!(RedisModule_LoadConfigs) {
        return Err("this server has no module config API; Redis 7.0 or later is required".into());
    }
    for (index, (config, &value)) in NUMERIC.iter().zip(initial).enumerate() {
        config.value.store(value, Relaxed);
        // SAFETY: OnLoad context; the name is static and NUL-terminated; the callbacks are
        // `extern "C"` and catch panics; privdata is the config's index, never dereferenced.
        let status = unsafe {
            rm!(RedisModule_RegisterNumericConfig)(
                ctx,
                config.name.as_ptr(),
                value,
                raw::REDISMODULE_CONFIG_DEFAULT,
                config.min,
                config.max,
                Some(get_numeric),
                Some(set_numeric),
                None,
                std::ptr::without_provenance_mut(index),
            )
        };
        if status != raw::REDISMODULE_OK as c_int {
            return Err(format!(
                "could not register config {PREFIX}{}",
                config.short_name()
            ));
        }
    }
    // SAFETY: OnLoad context, after every config is registered.
    let status = unsafe { rm!(RedisModule_LoadConfigs)(ctx) };
    if status != raw::REDISMODULE_OK as c_int {
        return Err("a ratelimit.* config directive has a bad value (see the line above)".into());
    }
    Ok(())
}

unsafe extern "C" fn get_numeric(
    _name: *const std::ffi::c_char,
    privdata: *mut c_void,
) -> c_longlong {
    catch_unwind(|| {
        NUMERIC
            .get(privdata.addr())
            .map_or(0, |config| config.value.load(Relaxed))
    })
    .unwrap_or(0)
}

unsafe extern "C" fn set_numeric(
    _name: *const std::ffi::c_char,
    value: c_longlong,
    privdata: *mut c_void,
    err: *mut *mut raw::RedisModuleString,
) -> c_int {
    let result = catch_unwind(AssertUnwindSafe(|| {
        let config = NUMERIC
            .get(privdata.addr())
            .ok_or_else(|| "unknown ratelimit config".to_string())?;
        // Redis checks the registered bounds before calling us; check again so a value out of
        // range can never reach the hot path.
        config.check(value)?;
        config.value.store(value, Relaxed);
        Ok::<(), String>(())
    }))
    .unwrap_or_else(|_| Err("ratelimit config setter failed".into()));
    match result {
        Ok(()) => raw::REDISMODULE_OK as c_int,
        Err(message) => {
            if !err.is_null() && has!(RedisModule_CreateString) {
                // SAFETY: Redis takes (and frees) the error string; a NULL context makes an
                // unmanaged string, as the config API expects.
                unsafe {
                    *err = rm!(RedisModule_CreateString)(
                        std::ptr::null_mut(),
                        message.as_ptr().cast(),
                        message.len(),
                    );
                }
            }
            raw::REDISMODULE_ERR as c_int
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIALECT_NAMES: [&str; 2] = ["cl.throttle", "gcra"];

    fn parsed(args: &[&str]) -> Result<LoadArgs, String> {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        initial_values(&args, &DIALECT_NAMES)
    }

    fn values(args: &[&str]) -> Result<i64, String> {
        parsed(args).map(|parsed| parsed.numeric[0])
    }

    fn dialects(value: &str) -> Result<Vec<bool>, String> {
        parsed(&["dialects", value]).map(|parsed| parsed.dialects)
    }

    #[test]
    fn every_dialect_unless_the_load_arguments_say_otherwise() {
        assert_eq!(parsed(&[]).unwrap().dialects, [true, true]);
        assert_eq!(
            parsed(&["max-log-limit", "7"]).unwrap().dialects,
            [true, true]
        );
        assert_eq!(dialects("all"), Ok(vec![true, true]));
        assert_eq!(dialects("none"), Ok(vec![false, false]));
        assert_eq!(dialects("cl.throttle"), Ok(vec![true, false]));
        assert_eq!(dialects("gcra"), Ok(vec![false, true]));
        assert_eq!(dialects("GCRA,CL.Throttle"), Ok(vec![true, true]));
        assert_eq!(dialects("gcra,gcra"), Ok(vec![false, true]));
        // Beside a config, in either order, and its name in any case.
        let both = parsed(&["DIALECTS", "gcra", "max-log-limit", "9"]).unwrap();
        assert_eq!((both.numeric[0], both.dialects), (9, vec![false, true]));
    }

    #[test]
    fn bad_dialects_are_explained() {
        let error = |value: &str| dialects(value).unwrap_err();
        for bad in [
            "",
            "cell",
            "gcra,",
            ",gcra",
            "gcra cl.throttle",
            "ratelimit.check",
        ] {
            assert!(
                error(bad).contains("refused") && error(bad).contains("cl.throttle, gcra"),
                "{bad:?}: {}",
                error(bad)
            );
        }
        assert!(error("cell").contains("unknown dialect 'cell'"));
        assert!(error("none,gcra").contains("'none' stands alone"));
        assert!(error("all,gcra").contains("'all' stands alone"));
        assert!(parsed(&["dialects"]).unwrap_err().contains("has no value"));
        assert!(parsed(&["dialects", "all", "dialects", "none"])
            .unwrap_err()
            .contains("more than once"));
        assert!(parsed(&["nonsense", "1"])
            .unwrap_err()
            .contains("known names: max-log-limit, max-policies, max-leases, dialects"));
    }

    #[test]
    fn defaults_without_arguments() {
        assert_eq!(values(&[]), Ok(DEFAULT_MAX_LOG_LIMIT));
    }

    #[test]
    fn names_with_or_without_prefix_any_case() {
        assert_eq!(values(&["max-log-limit", "50000"]), Ok(50_000));
        assert_eq!(values(&["ratelimit.max-log-limit", "7"]), Ok(7));
        assert_eq!(values(&["RateLimit.MAX-LOG-LIMIT", "1"]), Ok(1));
        assert_eq!(values(&["max-log-limit", "10000000"]), Ok(10_000_000));
    }

    #[test]
    fn bad_arguments_are_explained() {
        let error = |args: &[&str]| values(args).unwrap_err();
        assert!(error(&["max-log-limit", "abc"]).contains("'abc' refused"));
        assert!(error(&["max-log-limit", "0"]).contains("from 1 to 10000000"));
        assert!(error(&["max-log-limit", "10000001"]).contains("from 1 to 10000000"));
        assert!(error(&["max-log-limit", "-5"]).contains("refused"));
        assert!(error(&["max-log-limit", "+5"]).contains("refused"));
        assert!(error(&["max-log-limit", " 5"]).contains("refused"));
        assert!(error(&["max-log-limit", "99999999999999999999"]).contains("refused"));
        assert!(error(&["max-log-limit"]).contains("has no value"));
        assert!(error(&["ratelimit."]).contains("unknown load argument"));
        assert!(error(&["nonsense", "1"]).contains("unknown load argument 'nonsense'"));
        assert!(error(&["max-log-limit", "5", "max-log-limit", "6"]).contains("more than once"));
    }
}
