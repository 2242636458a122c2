//! [`Few`]: a vector whose first `N` elements live inline, in the value itself (on the stack of
//! the command that makes it), and only a longer one on the heap. The per-limit and per-key lists
//! of a command of several keys (`RATELIMIT.CHECKALL`) are a few elements long: made this way,
//! a call of up to `N` keys allocates nothing (every allocation is a `RM_Alloc` and a `RM_Free`,
//! about 190 instructions each, `make profile`).

use std::fmt;
use std::mem::MaybeUninit;
use std::ops::{Deref, DerefMut};

/// How many keys a command of several keys handles without allocating: CHECKALL's lists are
/// [`Few`]s of this many.
pub const FEW_KEYS: usize = 8;

/// A vector of `N` elements inline, more on the heap: pushed to, read as a slice.
pub struct Few<T, const N: usize> {
    /// The elements, while there are at most `N` (the first `len` are written).
    inline: [MaybeUninit<T>; N],
    /// How many of `inline` are written (0 once spilled).
    len: usize,
    /// Every element, once more than `N` were pushed (`spilled`).
    heap: Vec<T>,
    spilled: bool,
}

impl<T, const N: usize> Few<T, N> {
    /// An empty one (no allocation).
    #[inline(always)]
    pub fn new() -> Few<T, N> {
        Few {
            // SAFETY: an array of `MaybeUninit` is valid uninitialised (made in one piece: no
            // element is written until it is pushed).
            inline: unsafe { MaybeUninit::<[MaybeUninit<T>; N]>::uninit().assume_init() },
            len: 0,
            heap: Vec::new(),
            spilled: false,
        }
    }

    /// `count` clones of `value`.
    #[inline(always)]
    pub fn filled(value: T, count: usize) -> Few<T, N>
    where
        T: Clone,
    {
        let mut few = Few::new();
        for _ in 0..count {
            few.push(value.clone());
        }
        few
    }

    /// Appends `value`: inline while there is room, else (all elements moved there the first
    /// time) on the heap.
    #[inline(always)]
    pub fn push(&mut self, value: T) {
        if !self.spilled {
            if let Some(slot) = self.inline.get_mut(self.len) {
                slot.write(value);
                self.len += 1;
                return;
            }
            self.spill();
        }
        self.heap.push(value);
    }

    /// Moves the inline elements to the heap, where every later one goes.
    #[cold]
    fn spill(&mut self) {
        let mut heap = Vec::with_capacity(2 * N.max(1));
        // Cleared first: should anything below unwind, the inline elements leak rather than
        // drop twice.
        let len = std::mem::replace(&mut self.len, 0);
        for slot in &self.inline[..len] {
            // SAFETY: the first `len` slots were written by `push`, and each is read out once:
            // `len` is 0 from here on, so they are never read or dropped again.
            heap.push(unsafe { slot.assume_init_read() });
        }
        self.heap = heap;
        self.spilled = true;
    }
}

impl<T, const N: usize> Default for Few<T, N> {
    fn default() -> Few<T, N> {
        Few::new()
    }
}

impl<T, const N: usize> Deref for Few<T, N> {
    type Target = [T];

    #[inline(always)]
    fn deref(&self) -> &[T] {
        if self.spilled {
            return &self.heap;
        }
        // SAFETY: the first `len` slots are written (`push`), and borrowed with `self`.
        unsafe { std::slice::from_raw_parts(self.inline.as_ptr().cast::<T>(), self.len) }
    }
}

impl<T, const N: usize> DerefMut for Few<T, N> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut [T] {
        if self.spilled {
            return &mut self.heap;
        }
        // SAFETY: as in `deref`, borrowed mutably with `self`.
        unsafe { std::slice::from_raw_parts_mut(self.inline.as_mut_ptr().cast::<T>(), self.len) }
    }
}

impl<T, const N: usize> Drop for Few<T, N> {
    fn drop(&mut self) {
        if !self.spilled {
            // SAFETY: the first `len` slots are written and dropped once, here (the heap's
            // elements drop with the `Vec`).
            unsafe { std::ptr::drop_in_place(&mut **self) };
        }
    }
}

impl<T, const N: usize> FromIterator<T> for Few<T, N> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Few<T, N> {
        let mut few = Few::new();
        for value in iter {
            few.push(value);
        }
        few
    }
}

impl<T, const N: usize, const M: usize> From<[T; M]> for Few<T, N> {
    fn from(values: [T; M]) -> Few<T, N> {
        values.into_iter().collect()
    }
}

impl<'a, T, const N: usize> IntoIterator for &'a Few<T, N> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<'a, T, const N: usize> IntoIterator for &'a mut Few<T, N> {
    type Item = &'a mut T;
    type IntoIter = std::slice::IterMut<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter_mut()
    }
}

impl<T: Clone, const N: usize> Clone for Few<T, N> {
    fn clone(&self) -> Few<T, N> {
        self.iter().cloned().collect()
    }
}

impl<T: fmt::Debug, const N: usize> fmt::Debug for Few<T, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<T: PartialEq<U>, U, const N: usize, const M: usize> PartialEq<Few<U, M>> for Few<T, N> {
    fn eq(&self, other: &Few<U, M>) -> bool {
        **self == **other
    }
}

impl<T: Eq, const N: usize> Eq for Few<T, N> {}

impl<T: PartialEq<U>, U, const N: usize, const M: usize> PartialEq<[U; M]> for Few<T, N> {
    fn eq(&self, other: &[U; M]) -> bool {
        **self == *other
    }
}

impl<T: PartialEq<U>, U, const N: usize> PartialEq<Vec<U>> for Few<T, N> {
    fn eq(&self, other: &Vec<U>) -> bool {
        **self == **other
    }
}

#[cfg(test)]
mod tests {
    use super::Few;
    use std::rc::Rc;

    #[test]
    fn holds_its_elements_in_order_inline_and_past_its_room() {
        let mut few: Few<u32, 3> = Few::new();
        assert!(few.is_empty());
        for i in 0..3 {
            few.push(i);
        }
        assert!(!few.spilled);
        assert_eq!(few, [0, 1, 2]);
        for i in 3..40 {
            few.push(i);
        }
        assert!(few.spilled);
        assert_eq!(few, (0..40).collect::<Vec<_>>());
        few[39] = 7;
        assert_eq!(few.last(), Some(&7));
        assert_eq!(Few::<u8, 2>::filled(5, 4), [5, 5, 5, 5]);
        assert_eq!(Few::<u8, 2>::filled(5, 0), []);
        let collected: Few<usize, 4> = (0..4).collect();
        assert_eq!(collected.clone(), [0, 1, 2, 3]);
        assert_eq!(format!("{collected:?}"), "[0, 1, 2, 3]");
        let mut zero: Few<u8, 0> = Few::new();
        zero.push(1);
        assert_eq!(zero, [1]);
    }

    #[test]
    fn drops_every_element_once() {
        for count in [0, 1, 2, 3, 4, 9] {
            let counter = Rc::new(());
            let mut few: Few<Rc<()>, 3> = Few::new();
            for _ in 0..count {
                few.push(Rc::clone(&counter));
            }
            assert_eq!(Rc::strong_count(&counter), 1 + count);
            drop(few);
            assert_eq!(Rc::strong_count(&counter), 1, "{count} elements");
        }
    }
}
