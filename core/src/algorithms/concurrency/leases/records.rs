//! The records of a lease set: the slab every other part names leases in.
//!
//! One *class* per id length: fixed-size records `[expiry − base: 5 bytes][cost: 5 bytes][id]`
//! (little-endian) in pages of [`PAGE_RECORDS`]. A lease's *handle* is its class (7 bits) and its
//! place there (20 bits: `page << 5 | record`); the table and the tree hold handles only.
//!
//! Invariants (checked by `Leases::check_records` in test builds):
//! - a class's places are dense, `0..len`: a removed record's place is taken by the class's last
//!   one (the caller moves its handle in the table and the tree), so every page is full but the
//!   last;
//! - the last page is allocated to its records exactly, or with room for one record more in a
//!   large class ([`Class::may_keep_spare`]); the list of pages is at most a quarter beyond them;
//! - a class in use holds a record and no other class has its length; a class no lease uses any
//!   more (`id_len` 0) keeps its slot, since handles name classes by index, until a new length
//!   takes it, and the list of classes never ends with one, and is allocated exactly.

use std::cmp::Ordering;

use super::Leases;

pub(super) const FIELD_BITS: u32 = 40;
pub(super) const FIELD_MAX: u64 = (1 << FIELD_BITS) - 1;
/// Bytes of a record before its id: the expiry's offset and the cost.
pub(super) const HEAD: usize = 10;
pub(super) const CLASS_BITS: u32 = 7;
pub(super) const SLOT_BITS: u32 = 20;
pub(super) const HANDLE_BITS: u32 = CLASS_BITS + SLOT_BITS;
pub(super) const HANDLE_MASK: u32 = (1 << HANDLE_BITS) - 1;

/// Records per page: a place is `page << PAGE_BITS | record`.
pub(super) const PAGE_BITS: u32 = 5;
pub(super) const PAGE_RECORDS: usize = 1 << PAGE_BITS;
pub(super) const PAGE_MASK: usize = PAGE_RECORDS - 1;

pub(super) fn read40(bytes: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    word[..5].copy_from_slice(&bytes[..5]);
    u64::from_le_bytes(word)
}

pub(super) fn write40(bytes: &mut [u8], value: u64) {
    bytes[..5].copy_from_slice(&value.to_le_bytes()[..5]);
}

/// The records of the ids of one length, in pages of [`PAGE_RECORDS`]: every page full but the
/// last, which holds 1 to [`PAGE_RECORDS`] records and is allocated to them exactly, or with room
/// for one more in a large class ([`Class::may_keep_spare`]). Place `p` is record `p & PAGE_MASK`
/// of page `p >> PAGE_BITS`: the places are dense, `0..len`.
#[derive(Clone, Default)]
pub(super) struct Class {
    pub(super) pages: Vec<Box<[u8]>>,
    /// Records held.
    pub(super) len: u32,
    /// The ids' length (0: a class no lease uses any more, whose slot a new length may take).
    pub(super) id_len: u8,
}

impl Class {
    pub(super) fn size(&self) -> usize {
        HEAD + usize::from(self.id_len)
    }

    pub(super) fn len(&self) -> usize {
        self.len as usize
    }

    pub(super) fn record(&self, place: usize) -> &[u8] {
        let (size, at) = (self.size(), place & PAGE_MASK);
        &self.pages[place >> PAGE_BITS][at * size..(at + 1) * size]
    }

    pub(super) fn record_mut(&mut self, place: usize) -> &mut [u8] {
        let (size, at) = (self.size(), place & PAGE_MASK);
        &mut self.pages[place >> PAGE_BITS][at * size..(at + 1) * size]
    }

    /// Records in the last page (the class holds some).
    pub(super) fn in_last_page(&self) -> usize {
        (self.len() - 1) % PAGE_RECORDS + 1
    }

    /// Whether the last page may keep room for one record more, with `len` records held: when
    /// that room is at most an eighth of a byte per record.
    pub(super) fn may_keep_spare(&self, len: usize) -> bool {
        len >= 8 * self.size()
    }

    /// Adds `record` at place `len`: in the last page's spare room, else the last page grows by
    /// this record alone (a copy of at most a page), else a new page, the list of pages growing by
    /// an eighth.
    pub(super) fn push(&mut self, record: &[u8]) {
        let size = self.size();
        if self.len() % PAGE_RECORDS == 0 {
            if self.pages.len() == self.pages.capacity() {
                self.pages.reserve_exact((self.pages.len() / 8).max(1));
            }
            self.pages.push(Box::from(record));
        } else {
            let at = self.in_last_page() * size;
            let last = self.pages.last_mut().expect("a partial page");
            if last.len() < at + size {
                let mut page = std::mem::take(last).into_vec();
                page.reserve_exact(size);
                page.resize(at + size, 0);
                *last = page.into_boxed_slice();
            }
            last[at..at + size].copy_from_slice(record);
        }
        self.len += 1;
    }

    /// Removes the record at place `len − 1`. The last page keeps room for one record at most (and
    /// only as [`Class::may_keep_spare`] says); a page emptied goes, and the list of pages gives
    /// memory back once a quarter of it is unused.
    pub(super) fn pop(&mut self) {
        let size = self.size();
        let held = self.in_last_page();
        if held == 1 {
            self.pages.pop();
            let (len, capacity) = (self.pages.len(), self.pages.capacity());
            if capacity - len > len / 4 {
                self.pages.shrink_to(len + len / 8);
            }
        } else {
            let keep = held - 1 + usize::from(self.may_keep_spare(self.len() - 1));
            let last = self.pages.last_mut().expect("a record to pop");
            if last.len() > keep * size {
                let mut page = std::mem::take(last).into_vec();
                page.truncate(keep * size);
                *last = page.into_boxed_slice();
            }
        }
        self.len -= 1;
    }

    /// Bytes on the heap: the pages and the list of them.
    pub(super) fn heap_bytes(&self) -> usize {
        self.pages.capacity() * std::mem::size_of::<Box<[u8]>>()
            + self.pages.iter().map(|page| page.len()).sum::<usize>()
    }
}

pub(super) fn handle(class: usize, place: usize) -> u32 {
    (place as u32) << CLASS_BITS | class as u32
}

pub(super) fn class_of(handle: u32) -> usize {
    (handle & ((1 << CLASS_BITS) - 1)) as usize
}

pub(super) fn place_of(handle: u32) -> usize {
    (handle >> CLASS_BITS) as usize
}

/// The records, read through handles.
#[derive(Clone, Copy)]
pub(super) struct Records<'a> {
    pub(super) classes: &'a [Class],
}

impl<'a> Records<'a> {
    pub(super) fn record(&self, handle: u32) -> &'a [u8] {
        self.classes[class_of(handle)].record(place_of(handle))
    }

    pub(super) fn offset(&self, handle: u32) -> u64 {
        read40(self.record(handle))
    }

    pub(super) fn cost(&self, handle: u32) -> u64 {
        read40(&self.record(handle)[5..])
    }

    pub(super) fn id(&self, handle: u32) -> &'a [u8] {
        &self.record(handle)[HEAD..]
    }

    /// The order of the tree: by expiry, then by id.
    pub(super) fn cmp(&self, a: u32, b: u32) -> Ordering {
        let (ra, rb) = (self.record(a), self.record(b));
        read40(ra)
            .cmp(&read40(rb))
            .then_with(|| ra[HEAD..].cmp(&rb[HEAD..]))
    }

    pub(super) fn less(&self, a: u32, b: u32) -> bool {
        self.cmp(a, b) == Ordering::Less
    }
}

impl Leases {
    /// The class of the ids of `id_len` bytes: the one holding them, else a slot no lease uses
    /// any more, else a new one (the list of classes held to its length).
    pub(super) fn class_for(&mut self, id_len: usize) -> usize {
        let id_len = id_len as u8;
        if let Some(class) = self.classes.iter().position(|c| c.id_len == id_len) {
            return class;
        }
        let class = match self.classes.iter().position(|c| c.id_len == 0) {
            Some(free) => free,
            None => {
                self.classes.reserve_exact(1);
                self.classes.push(Class::default());
                self.classes.len() - 1
            }
        };
        self.classes[class].id_len = id_len;
        class
    }

    /// Checks the records' invariants (the module documentation) for a set of `leases` leases
    /// (tests).
    #[cfg(test)]
    pub(super) fn check_records(&self, leases: usize) {
        // The classes: the pages full but the last, allocated exactly; no class slot unused at
        // the end of the list, which is allocated exactly.
        assert_eq!(self.classes.capacity(), self.classes.len());
        assert!(self.classes.last().is_none_or(|c| c.id_len != 0));
        for (i, class) in self.classes.iter().enumerate() {
            let size = class.size();
            assert_eq!(class.pages.len(), class.len().div_ceil(PAGE_RECORDS));
            assert!(class.pages.capacity() - class.pages.len() <= class.pages.len() / 4);
            for (p, page) in class.pages.iter().enumerate() {
                let held = (class.len() - p * PAGE_RECORDS).min(PAGE_RECORDS);
                let spare = page.len() / size - held;
                assert_eq!(page.len() % size, 0);
                assert!(
                    spare == 0
                        || (spare == 1
                            && p + 1 == class.pages.len()
                            && held < PAGE_RECORDS
                            && class.may_keep_spare(class.len())),
                    "page {p} of class {i}: {held} records, room for {spare} more"
                );
            }
            if class.id_len == 0 {
                assert_eq!(class.len(), 0);
            } else {
                assert!(class.len() > 0, "a class in use holds a record");
                assert!(self.classes[..i].iter().all(|c| c.id_len != class.id_len));
            }
        }
        let stored: usize = self.classes.iter().map(Class::len).sum();
        assert_eq!(stored, leases);
    }
}
