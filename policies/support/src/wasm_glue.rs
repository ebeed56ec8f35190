//! Runtime glue for `no_std` policy components: without it a Rust guest would need `std`, and
//! `std` on `wasm32-wasip2` imports a dozen WASI interfaces even for a pure function.

#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

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
