//! A limit spec given as one argument (`"sliding-window 100 1m"`, `"POLICY api"`): read as the
//! words it holds, in its place, so that a call is exactly the call with those words given
//! separately (the same reply, effects and errors). No algorithm name, number, period or policy
//! name holds a space: an argument where a spec starts that holds one is a one-argument spec.
//!
//! Only a spec's words go inside it (`COST`, `AT` and `MAX` follow it as arguments of their own),
//! and it holds a whole spec: what the grammar reads of a spec never continues past it. Its words
//! are checked, in order, before anything else of the call is read (see [`ArgError::SpecWords`]).

use crate::error::{ArgError, SpecWordsError};
use crate::few::Few;

use super::spec::{is_policy, option, OptionName};

/// How many words a CHECK-shaped call reads inline once its spec is split: the longest spec
/// (`algorithm limit period BURST capacity BLOCK duration`), `COST`, `AT` and room to spare. A
/// longer one (always refused) spills to the heap.
pub const CALL_WORDS: usize = 24;

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// Whether `arg`, where a spec starts, is a one-argument spec: it holds a space. Every CHECK asks:
/// from 8 to 16 bytes (every algorithm's name, most specs) two words of 8 answer.
#[inline(always)]
pub fn is_one_argument_spec(arg: &[u8]) -> bool {
    // A zero byte of `word ^ spaces` is a space (the test for some zero byte is exact).
    let has_space = |chunk: &[u8]| {
        let word =
            u64::from_le_bytes(chunk.try_into().expect("8 bytes")) ^ (ONES * u64::from(b' '));
        word.wrapping_sub(ONES) & !word & HIGHS != 0
    };
    match arg.len() {
        8..=16 => has_space(&arg[..8]) || has_space(&arg[arg.len() - 8..]),
        _ => arg.contains(&b' '),
    }
}

/// The option names a one-argument spec may not hold: those of the call, not of the spec
/// (told by their length first: most words are none of them).
#[inline(always)]
fn call_option(word: &[u8]) -> Option<&'static str> {
    match word.len() {
        2 if word.eq_ignore_ascii_case(b"AT") => Some("AT"),
        3 if word.eq_ignore_ascii_case(b"MAX") => Some("MAX"),
        4 if word.eq_ignore_ascii_case(b"COST") => Some("COST"),
        _ => None,
    }
}

/// The first position at or after `from` of a byte at most `b' '` (a space, or a control byte),
/// or `bytes.len()`: 8 bytes at a time, as a word of 8 (the lowest byte below 0x21 sets the lowest
/// flag; bytes from 0x80 up never set it).
#[inline(always)]
fn next_low(bytes: &[u8], from: usize) -> usize {
    let mut i = from;
    while let Some(chunk) = bytes.get(i..i + 8) {
        let word = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
        let low = word.wrapping_sub(ONES * 0x21) & !word & HIGHS;
        if low != 0 {
            return i + (low.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while bytes.get(i).is_some_and(|byte| *byte > b' ') {
        i += 1;
    }
    i
}

/// Appends the words of the one-argument spec `arg` (`args[at]` of the caller) to `out`, checked
/// word by word, in order: no empty word, no tab or newline, no option of the call; then a whole
/// spec. One pass over the bytes, 8 at a time (`make profile`: a byte at a time, the split cost
/// most of what the two arguments saved).
#[inline(always)]
pub(super) fn push_spec_words<'a, const N: usize>(
    arg: &'a [u8],
    at: usize,
    out: &mut Few<&'a [u8], N>,
) -> Result<(), ArgError> {
    let refused = |problem| Err(ArgError::SpecWords { at, problem });
    let (start, mut word_start, mut scan) = (out.len(), 0, 0);
    loop {
        let end = next_low(arg, scan);
        match arg.get(end) {
            // A control byte that is no whitespace belongs to its word (the grammar refuses it).
            Some(byte) if *byte != b' ' => {
                if matches!(byte, b'\t' | b'\n' | b'\r' | 0x0b | 0x0c) {
                    return refused(SpecWordsError::Whitespace);
                }
                scan = end + 1;
                continue;
            }
            _ => {}
        }
        // A space, or the end of the argument, ends a word.
        let word = &arg[word_start..end];
        if word.is_empty() {
            return refused(SpecWordsError::EmptyWord);
        }
        if let Some(name) = call_option(word) {
            return refused(SpecWordsError::CallOption(name));
        }
        out.push(word);
        if end == arg.len() {
            break;
        }
        (word_start, scan) = (end + 1, end + 1);
    }
    // A rate limit's spec needs its period, and a BURST or BLOCK at its end its value; `POLICY
    // name` is whole (what follows the name inside is refused by the grammar itself).
    let words = &out[start..];
    let whole = (words.len() >= 3
        && ((words.len() - 3) % 2 == 0
            || !matches!(
                words.last().and_then(|word| option(word)),
                Some(OptionName::Burst | OptionName::Block)
            )))
        || is_policy(words[0]);
    if !whole {
        return refused(SpecWordsError::Incomplete);
    }
    Ok(())
}

/// `args` of a CHECK-shaped call (CHECK, PEEK, REFUND, TAKE: a spec first) whose first is a
/// one-argument spec, into `words`: its words, then the other arguments. The error is a malformed
/// one-argument spec's, its position in `args`.
#[inline(always)]
pub fn split_call<'a, const N: usize>(
    args: &[&'a [u8]],
    words: &mut Few<&'a [u8], N>,
) -> Result<(), ArgError> {
    let Some((first, rest)) = args.split_first() else {
        return Ok(());
    };
    push_spec_words(first, 0, words)?;
    for arg in rest {
        words.push(arg);
    }
    Ok(())
}

/// Reads the arguments of a CHECK-shaped call with `read`: as they are, or with the one-argument
/// spec they start with split into its words ([`split_call`]). The error is a malformed
/// one-argument spec's, its position in `args`; `read`'s own errors are in what `read` returns,
/// their positions in the words it was given.
#[inline(always)]
pub fn read_call<'a, T>(
    args: &[&'a [u8]],
    read: impl FnOnce(&[&'a [u8]]) -> T,
) -> Result<T, ArgError> {
    match args.first() {
        Some(first) if is_one_argument_spec(first) => {
            let mut words: Few<&'a [u8], CALL_WORDS> = Few::new();
            split_call(args, &mut words)?;
            Ok(read(&words))
        }
        _ => Ok(read(args)),
    }
}
