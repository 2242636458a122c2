//! Integer arguments: the one reading of a plain decimal integer, shared by the commands'
//! arguments and the module's load arguments (a leaf: it uses nothing of ours).

/// A plain decimal integer: digits only, no sign, fraction or exponent. Inlined: every CHECK
/// reads two or more (`make profile`).
#[inline(always)]
pub fn parse_integer(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() {
        return None;
    }
    // Up to 19 digits cannot overflow a u64 (this runs on every call): eight digits at a time,
    // then one multiply-add per digit left.
    if bytes.len() <= 19 {
        let mut value = 0u64;
        let mut rest = bytes;
        while let Some((chunk, tail)) = rest.split_first_chunk::<8>() {
            value = value * 100_000_000 + eight_digits(*chunk)?;
            rest = tail;
        }
        if rest.len() >= 4 {
            return Some(value * POWERS_OF_TEN[rest.len()] + four_to_seven_digits(rest)?);
        }
        for &byte in rest {
            let digit = byte.wrapping_sub(b'0');
            if digit > 9 {
                return None;
            }
            value = value * 10 + u64::from(digit);
        }
        return Some(value);
    }
    bytes.iter().try_fold(0u64, |value, byte| {
        let digit = byte.checked_sub(b'0').filter(|digit| *digit < 10)?;
        value.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

/// `10^n` for `n` below 8.
const POWERS_OF_TEN: [u64; 8] = [1, 10, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000];

/// Four to seven ASCII digits as a number: read as eight behind leading zeros, in one word made
/// of the first four bytes and the last four (which overlap by what they share), so a limit such
/// as `100000` costs one [`eight_digits`] rather than a multiply-add per digit.
#[inline(always)]
fn four_to_seven_digits(digits: &[u8]) -> Option<u64> {
    let n = digits.len();
    debug_assert!((4..8).contains(&n));
    let (Some(first), Some(last)) = (digits.first_chunk::<4>(), digits.last_chunk::<4>()) else {
        return None;
    };
    let first = u64::from(u32::from_le_bytes(*first));
    let last = u64::from(u32::from_le_bytes(*last));
    // Little-endian: byte `k` of the word is the `k`-th character of `0...0digits`.
    let zeros = (0x30 * 0x0101_0101_0101_0101u64) >> (8 * n);
    let word = zeros | first << (8 * (8 - n)) | last << 32;
    eight_digits(word.to_le_bytes())
}

/// Eight ASCII digits (the first the most significant) as a number, in one word: every byte
/// must be `0x30..=0x39` (its high nibble 3, and no carry out of its low nibble when 6 is
/// added), then pairs, fours and the eight digits are combined with three multiplications.
fn eight_digits(chunk: [u8; 8]) -> Option<u64> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0xF0 * ONES;
    let word = u64::from_le_bytes(chunk);
    // With every high nibble 3, adding 6 to each byte cannot carry into the next one.
    if word & HIGH != 0x30 * ONES || word.wrapping_add(6 * ONES) & HIGH != 0x30 * ONES {
        return None;
    }
    let digits = word - 0x30 * ONES;
    // Each 16-bit lane's low byte: 10 × its first digit + its second.
    let pairs = digits * 10 + (digits >> 8);
    // The lanes' low bytes weighted 10^6, 10^4, 10^2, 1, summed in the upper half of a product.
    const LANES: u64 = 0x0000_00FF_0000_00FF;
    // (The products wrap by design: what overflows lies above the half that is kept.)
    let high = (pairs & LANES).wrapping_mul(100 + (1_000_000 << 32));
    let low = ((pairs >> 16) & LANES).wrapping_mul(1 + (10_000 << 32));
    Some(high.wrapping_add(low) >> 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_are_plain_decimal() {
        assert_eq!(parse_integer(b"0"), Some(0));
        assert_eq!(parse_integer(b"007"), Some(7));
        assert_eq!(parse_integer(b"18446744073709551615"), Some(u64::MAX));
        // Leading zeros do not count towards overflow.
        assert_eq!(
            parse_integer(b"9999999999999999999"),
            Some(9_999_999_999_999_999_999)
        );
        assert_eq!(
            parse_integer(b"09999999999999999999"),
            Some(9_999_999_999_999_999_999)
        );
        assert_eq!(parse_integer(b"0000000000000000000000042"), Some(42));
        for bad in [
            &b"999999999999999999/"[..],
            b"99999999999999999:9",
            b"0000000000000000000000042x",
            &b""[..],
            b"+1",
            b"-1",
            b"1.0",
            b"1e3",
            b" 1",
            b"18446744073709551616",
        ] {
            assert_eq!(parse_integer(bad), None, "{bad:?}");
        }
    }

    /// The plain reading `parse_integer` must agree with: digits only, no overflow.
    fn plain_integer(bytes: &[u8]) -> Option<u64> {
        if bytes.is_empty() || !bytes.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(bytes).ok()?.parse().ok()
    }

    #[test]
    fn eight_digits_at_a_time_read_every_byte() {
        // Every byte value at every position of numbers of 4 to 9, 12, 15 and 16 digits (none,
        // one or two words of eight, and four to seven digits read as one word or not): exactly
        // the digits pass, and a digit counts at its place.
        for base in [
            &b"1234"[..],
            b"54321",
            b"100000",
            b"7654321",
            b"12345678",
            b"987654321",
            b"123456789012",
            b"987654321098765",
            b"1000000000000009",
        ] {
            for at in 0..base.len() {
                for byte in 0..=255u8 {
                    let mut text = base.to_vec();
                    text[at] = byte;
                    assert_eq!(parse_integer(&text), plain_integer(&text), "{text:?}");
                }
            }
        }
        assert_eq!(eight_digits(*b"99999999"), Some(99_999_999));
        assert_eq!(eight_digits(*b"00000000"), Some(0));
        assert_eq!(eight_digits(*b"10000001"), Some(10_000_001));
    }

    proptest::proptest! {
        #[test]
        fn integers_of_any_length_read_as_std_reads_them(
            text in proptest::collection::vec(
                proptest::sample::select(b"0123456789/:0123456789 \xff".to_vec()),
                0..26,
            ),
        ) {
            proptest::prop_assert_eq!(parse_integer(&text), plain_integer(&text));
        }
    }
}
