//! Hostile test guest: a `std` admission policy. Reading the clock and the environment makes the
//! component import WASI interfaces, which the policy contract does not grant: the host must
//! refuse to load it.

wit_bindgen::generate!({ world: "cpu-class-admission-policy", path: "../../../wit" });
use exports::cocoonstack::vk_policy::cpu_class_admission::{Decision, Facts, Guest, Verdict};

struct Importer;
impl Guest for Importer {
    fn decide(_facts: Facts) -> Decision {
        let now = std::time::SystemTime::now();
        let mood = std::env::var("POLICY_MOOD").unwrap_or_default();
        Decision {
            verdict: Verdict::Admit,
            reason: "wasi".into(),
            message: format!("{mood} {now:?}"),
        }
    }
}
#[cfg(target_arch = "wasm32")]
export!(Importer);

/// The canonical ABI's allocator entry point (std guests get none from wit-bindgen here).
///
/// # Safety
/// Called by the component model with a valid layout.
#[cfg(target_arch = "wasm32")]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cabi_realloc(old: *mut u8, old_len: usize, align: usize, new_len: usize) -> *mut u8 {
    use std::alloc::{Layout, alloc, realloc};
    if new_len == 0 {
        return align as *mut u8;
    }
    // SAFETY: the canonical ABI passes a valid alignment and sizes.
    unsafe {
        if old_len == 0 {
            alloc(Layout::from_size_align_unchecked(new_len, align))
        } else {
            realloc(old, Layout::from_size_align_unchecked(old_len, align), new_len)
        }
    }
}
