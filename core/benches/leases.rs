//! `cargo bench -p redis-ratelimit-core --bench leases`: the lease set of a concurrency key
//! (`Leases`: records, a hash table by id and a counted B+ tree by expiry) as it grows to 10,
//! 1,000 and 100,000 leases of 16-byte ids: a new lease inserted then removed (an ACQUIRE of a new
//! id, then its RELEASE), the renewal of a held lease (its expiry moves within the tree), and the
//! look-up of a held id. With each size, the bytes a lease takes: as the set counts them for
//! `MEMORY USAGE`, and as the allocator was asked for them (a counting allocator).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use redis_ratelimit_core::algorithms::concurrency::{Lease, Leases};

/// The system allocator, counting the bytes it holds for the program.
struct Counting;

static HELD: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed on to `System` unchanged; only the count is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        HELD.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        HELD.fetch_add(new_size, Ordering::Relaxed);
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Leases of a day from this time: none expires during the run.
const BASE_MS: u64 = 1_800_000_000_000;
const DAY_MS: u64 = 86_400_000;

/// A 16-byte id, as a request id would be.
fn id(prefix: char, i: u64) -> [u8; 16] {
    let mut id = [0u8; 16];
    id.copy_from_slice(format!("{prefix}{i:015}").as_bytes());
    id
}

fn lease(expiry_ms: u64) -> Lease {
    Lease { cost: 1, expiry_ms }
}

fn main() {
    let mut bench = common::Bench::new("leases");
    let sizes: &[u64] = if bench.measuring() {
        &[10, 1_000, 100_000]
    } else {
        &[10, 1_000]
    };
    let mut memory = Vec::new();
    for &n in sizes {
        let before = HELD.load(Ordering::Relaxed);
        let mut set = Box::new(Leases::new());
        for i in 0..n {
            let fresh = set.insert(&id('f', i), lease(BASE_MS + DAY_MS));
            assert_eq!(fresh, Ok(None), "lease {i} of {n}");
        }
        let held = HELD.load(Ordering::Relaxed) - before;
        memory.push(vec![
            n.to_string(),
            format!(
                "{:.1}",
                (std::mem::size_of::<Leases>() + set.heap_bytes()) as f64 / n as f64
            ),
            format!("{:.1}", held as f64 / n as f64),
        ]);
        let mut state = (set, 0u64);
        bench.case(
            &format!("a new lease, then its release, beside {n}"),
            &mut state,
            true,
            |(set, i)| {
                *i += 1;
                let new = id('b', *i);
                set.insert(&new, lease(BASE_MS + DAY_MS)) == Ok(None) && set.remove(&new).is_some()
            },
        );
        bench.case(
            &format!("the renewal of one of {n} leases"),
            &mut state,
            true,
            |(set, i)| {
                *i += 1;
                let held = id('f', (*i * 7919) % n);
                matches!(set.insert(&held, lease(BASE_MS + DAY_MS + *i)), Ok(Some(_)))
            },
        );
        bench.case(
            &format!("the look-up of one of {n} leases"),
            &mut state,
            true,
            |(set, i)| {
                *i += 1;
                set.get(&id('f', (*i * 7919) % n)).is_some()
            },
        );
    }
    bench.table(
        "Bytes a lease of a 16-byte id takes: counted, the set's `heap_bytes` and its header (what \
         `MEMORY USAGE` reports); allocated, what the set asked the allocator for (before the \
         allocator rounds it up to its size classes):",
        &["leases", "bytes a lease, counted", "bytes a lease, allocated"],
        &memory,
    );
    bench.finish();
}
