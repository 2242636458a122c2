//! The randomized tests' generator: small, fast, deterministic (splitmix64), so that a failing run
//! replays from its seed. Each test names its seed's environment variable ([`seed_from_env`]).

/// A deterministic generator: the same seed (and stream) gives the same sequence on every run.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// An independent sequence per `stream` from one seed (e.g. one per algorithm).
    pub fn with_stream(seed: u64, stream: u64) -> Rng {
        Rng(seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03))
    }

    /// The next number (splitmix64). Not `Iterator::next`: the sequence never ends, and the tests
    /// call it by this name.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`; 0 when `n` is 0.
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `0..len`, for indexing: 0 when `len` is 0.
    pub fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }

    /// Uniform in `lo..=hi`; `lo` when the range is empty.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.below(hi - lo + 1)
    }

    /// Roughly uniform in the number of bits between `lo` (at least 1) and `hi`: small values are
    /// as likely as huge ones.
    pub fn log_uniform(&mut self, lo: u64, hi: u64) -> u64 {
        let lo = lo.max(1);
        if hi <= lo {
            return lo;
        }
        let bits_lo = 64 - lo.leading_zeros();
        let bits_hi = 64 - hi.leading_zeros();
        let bits = self.range(u64::from(bits_lo), u64::from(bits_hi)) as u32;
        let start = if bits <= 1 { 1 } else { 1u64 << (bits - 1) };
        let end = if bits >= 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        };
        self.range(start.max(lo), end.min(hi))
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// One of `items` (not empty), copied.
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        *self.pick_ref(items)
    }

    /// One of `items` (not empty).
    pub fn pick_ref<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.index(items.len())]
    }

    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.index(i + 1);
            items.swap(i, j);
        }
    }

    /// Random bytes, fewer than `max`.
    pub fn bytes(&mut self, max: u64) -> Vec<u8> {
        let len = self.below(max);
        (0..len).map(|_| self.next() as u8).collect()
    }
}

/// A seed as `$var` gives it (decimal or `0x` hex), else `default()`; printed as `var=0x...` so a
/// failing run shows how to replay it. Panics on a value that is not a number.
pub fn seed_from_env(var: &str, default: impl FnOnce() -> u64) -> u64 {
    let seed = match std::env::var(var) {
        Ok(text) => parse_seed(&text).unwrap_or_else(|e| panic!("{var}={text:?}: {e}")),
        Err(_) => default(),
    };
    eprintln!("{var}={seed:#x}");
    seed
}

/// A seed in decimal or `0x` hex.
pub fn parse_seed(text: &str) -> Result<u64, std::num::ParseIntError> {
    let text = text.trim();
    match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    }
}
