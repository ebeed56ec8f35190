//! Runtime glue for `no_std` policy components: without it a Rust guest would need `std`, and
//! `std` on `wasm32-wasip2` imports a dozen WASI interfaces even for a pure function.

use core::alloc::{GlobalAlloc, Layout};
use core::cell::UnsafeCell;

#[global_allocator]
static ALLOCATOR: BumpAllocator = BumpAllocator::new();

/// Bytes of the zero-initialised arena allocations come from before memory has to grow.
const ARENA_BYTES: usize = 32 << 10;
const WASM_PAGE: usize = 64 << 10;

/// A bump allocator for single-decision instances: the host gives every decision a fresh
/// instance and discards it afterwards, so nothing needs freeing. Allocations come from an
/// arena in the module's zero-initialised data, so a typical decision never grows linear
/// memory (growth costs the host page-protection changes on every decision); past the arena
/// it grows memory, and when the host's memory limit refuses that, allocation fails and the
/// guest traps, which the host reports as out of memory.
struct BumpAllocator {
    arena: UnsafeCell<[u8; ARENA_BYTES]>,
    /// (next free address, end of the current region); (0, 0) before the first allocation.
    cursor: UnsafeCell<(usize, usize)>,
}

// SAFETY: a policy instance runs on one thread; wasm32 here has no threads.
unsafe impl Sync for BumpAllocator {}

impl BumpAllocator {
    const fn new() -> Self {
        BumpAllocator {
            arena: UnsafeCell::new([0; ARENA_BYTES]),
            cursor: UnsafeCell::new((0, 0)),
        }
    }
}

unsafe impl GlobalAlloc for BumpAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: single-threaded (see `Sync` above); no reference to the cursor escapes.
        let cursor = unsafe { &mut *self.cursor.get() };
        if cursor.1 == 0 {
            let start = self.arena.get() as usize;
            *cursor = (start, start + ARENA_BYTES);
        }
        let align = layout.align();
        let size = layout.size();
        let mut start = (cursor.0 + align - 1) & !(align - 1);
        if start.checked_add(size).is_none_or(|end| end > cursor.1) {
            // Grow linear memory by enough pages for this allocation; the new pages start at
            // the old end of memory and become the current region.
            let pages = (size + align).div_ceil(WASM_PAGE);
            let old_pages = core::arch::wasm32::memory_grow(0, pages);
            if old_pages == usize::MAX {
                return core::ptr::null_mut();
            }
            let region = old_pages * WASM_PAGE;
            *cursor = (region, region + pages * WASM_PAGE);
            start = (region + align - 1) & !(align - 1);
        }
        cursor.0 = start + size;
        start as *mut u8
    }

    unsafe fn dealloc(&self, _ptr: *mut u8, _layout: Layout) {
        // Freed all at once when the host discards the instance.
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: single-threaded; the cursor is only read here.
        let (next, end) = unsafe { *self.cursor.get() };
        // The most recent allocation grows in place (strings and vectors being built).
        if ptr as usize + layout.size() == next && (ptr as usize).checked_add(new_size).is_some_and(|e| e <= end) {
            // SAFETY: as above.
            unsafe { (*self.cursor.get()).0 = ptr as usize + new_size };
            return ptr;
        }
        // SAFETY: `layout` is valid for `ptr`, and the new layout keeps its alignment.
        let new = unsafe { self.alloc(Layout::from_size_align_unchecked(new_size, layout.align())) };
        if !new.is_null() {
            // SAFETY: both regions are valid for the smaller of the two sizes and do not overlap.
            unsafe { core::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size)) };
        }
        new
    }
}

/// A panicking policy traps; the host turns the trap into its slot's fail-safe outcome.
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    core::arch::wasm32::unreachable()
}

// `wasm32-wasip2` expects libc to provide the C memory routines. With bulk memory enabled
// (the target default) `memcpy`/`memmove`/`memset` lower to `memory.copy`/`memory.fill`, but
// comparisons still call `memcmp`/`bcmp`; without these definitions they would become imports.

/// C `memcmp`: byte-wise comparison of two regions of length `n`.
///
/// # Safety
/// `a` and `b` must be valid for reads of `n` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    let mut i = 0;
    while i < n {
        // SAFETY: the caller guarantees both regions hold `n` readable bytes.
        let (x, y) = unsafe { (core::ptr::read_volatile(a.add(i)), core::ptr::read_volatile(b.add(i))) };
        if x != y {
            return i32::from(x) - i32::from(y);
        }
        i += 1;
    }
    0
}

/// C `bcmp`: zero when the regions are equal.
///
/// # Safety
/// `a` and `b` must be valid for reads of `n` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: same contract as `memcmp`.
    unsafe { memcmp(a, b, n) }
}

/// The canonical ABI's allocation entry point: the host calls it to place arguments (strings,
/// lists) in guest memory. Exported here because `no_std` guests get no libc or wit-bindgen
/// runtime to provide it.
///
/// # Safety
/// Called by the component model with a pointer previously returned by this function (or null
/// with `old_len == 0`) and a valid power-of-two `align`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cabi_realloc(old: *mut u8, old_len: usize, align: usize, new_len: usize) -> *mut u8 {
    use alloc::alloc::{Layout, alloc, realloc};
    if new_len == 0 {
        return align as *mut u8;
    }
    // SAFETY: the canonical ABI passes a valid power-of-two alignment and sizes that fit.
    let ptr = unsafe {
        if old_len == 0 {
            alloc(Layout::from_size_align_unchecked(new_len, align))
        } else {
            realloc(old, Layout::from_size_align_unchecked(old_len, align), new_len)
        }
    };
    if ptr.is_null() {
        // Out of memory inside the sandbox: trap, the host fails safe.
        core::arch::wasm32::unreachable()
    }
    ptr
}
