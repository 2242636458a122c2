//! The byte buffers the encodings are written to ([`Sink`], [`StackBuf`]: a payload on the
//! stack) and read from (`Reader`).

use crate::algorithms::concurrency::MAX_ID_LEN;

use super::limiter::DecodeError;

/// Where an encoding is written: a `Vec`, or a stack buffer on the hot path.
pub trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// The largest change a command replicates: a lease's (a kind byte, four words and an id of up
/// to [`MAX_ID_LEN`] bytes).
pub(super) const STACK_BUF_LEN: usize = 1 + 32 + MAX_ID_LEN;

/// A fixed stack buffer, large enough for every change a command replicates. Its bytes are not
/// initialised until written (every CHECK makes one: zeroing it would cost as much as the write).
pub struct StackBuf {
    bytes: [std::mem::MaybeUninit<u8>; STACK_BUF_LEN],
    len: usize,
    overflowed: bool,
}

impl Default for StackBuf {
    fn default() -> Self {
        StackBuf {
            // SAFETY: an array of `MaybeUninit` is valid uninitialised (made so in one piece: an
            // array of `uninit()` elements was zeroed on every CHECK).
            bytes: unsafe {
                std::mem::MaybeUninit::<[std::mem::MaybeUninit<u8>; STACK_BUF_LEN]>::uninit()
                    .assume_init()
            },
            len: 0,
            overflowed: false,
        }
    }
}

impl StackBuf {
    /// The bytes written, or `None` if they did not fit.
    pub fn as_slice(&self) -> Option<&[u8]> {
        // SAFETY: the first `len` bytes were written by `put` (`len` never exceeds the buffer).
        let written =
            unsafe { std::slice::from_raw_parts(self.bytes.as_ptr().cast::<u8>(), self.len) };
        (!self.overflowed).then_some(written)
    }
}

impl Sink for StackBuf {
    fn put(&mut self, bytes: &[u8]) {
        match self.bytes.get_mut(self.len..self.len + bytes.len()) {
            Some(room) => {
                // SAFETY: `room` is `bytes.len()` writable bytes of the buffer, which `bytes` (a
                // shared borrow) cannot overlap.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        bytes.as_ptr(),
                        room.as_mut_ptr().cast::<u8>(),
                        bytes.len(),
                    )
                };
                self.len += bytes.len();
            }
            None => self.overflowed = true,
        }
    }
}

/// A cursor over a payload.
pub(super) struct Reader<'a> {
    pub(super) bytes: &'a [u8],
}

impl Reader<'_> {
    pub(super) fn take<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let (head, rest) = self
            .bytes
            .split_first_chunk::<N>()
            .ok_or(DecodeError::Length)?;
        self.bytes = rest;
        Ok(*head)
    }

    pub(super) fn u64(&mut self) -> Result<u64, DecodeError> {
        self.take::<8>().map(u64::from_le_bytes)
    }

    pub(super) fn u128(&mut self) -> Result<u128, DecodeError> {
        self.take::<16>().map(u128::from_le_bytes)
    }
}

impl<'a> Reader<'a> {
    pub(super) fn slice(&mut self, len: usize) -> Result<&'a [u8], DecodeError> {
        let (head, rest) = self
            .bytes
            .split_at_checked(len)
            .ok_or(DecodeError::Length)?;
        self.bytes = rest;
        Ok(head)
    }
}

pub(super) fn require(condition: bool) -> Result<(), DecodeError> {
    if condition {
        Ok(())
    } else {
        Err(DecodeError::State)
    }
}
