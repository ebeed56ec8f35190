//! Host bindings generated from `wit/`: one module per slot world. The shared `types`
//! interface is generated once (in [`snapshot`]) and reused by the other worlds, so a pod's
//! facts have one Rust type whatever slot they go to.

pub mod snapshot {
    wasmtime::component::bindgen!({
        world: "snapshot-before-destroy-policy",
        path: "wit",
    });
}

pub mod bring_up {
    wasmtime::component::bindgen!({
        world: "bring-up-policy",
        path: "wit",
        with: { "cocoonstack:vk-policy/types": crate::policy::bindings::snapshot::cocoonstack::vk_policy::types },
    });
}

pub mod admission {
    wasmtime::component::bindgen!({
        world: "cpu-class-admission-policy",
        path: "wit",
        with: { "cocoonstack:vk-policy/types": crate::policy::bindings::snapshot::cocoonstack::vk_policy::types },
    });
}

pub mod translation {
    wasmtime::component::bindgen!({
        world: "resource-translation-policy",
        path: "wit",
        with: { "cocoonstack:vk-policy/types": crate::policy::bindings::snapshot::cocoonstack::vk_policy::types },
    });
}

pub mod guest_fixup {
    wasmtime::component::bindgen!({
        world: "guest-fixup-policy",
        path: "wit",
        with: { "cocoonstack:vk-policy/types": crate::policy::bindings::snapshot::cocoonstack::vk_policy::types },
    });
}

pub use admission::exports::cocoonstack::vk_policy::cpu_class_admission as wit_admission;
pub use bring_up::exports::cocoonstack::vk_policy::bring_up as wit_bring_up;
pub use guest_fixup::exports::cocoonstack::vk_policy::guest_fixup as wit_guest_fixup;
pub use snapshot::cocoonstack::vk_policy::types;
pub use snapshot::exports::cocoonstack::vk_policy::snapshot_before_destroy as wit_snapshot;
pub use translation::exports::cocoonstack::vk_policy::resource_translation as wit_translation;
