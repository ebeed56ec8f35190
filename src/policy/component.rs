//! Loading a policy component for a slot: compile (or take it from the cache), check that it
//! imports nothing and exports the slot's interface with the right types, and pre-resolve it
//! into an `InstancePre` so each decision only instantiates.

use std::fmt;

use wasmtime::component::types::ComponentItem;
use wasmtime::component::{Component, Linker};

use super::bindings::{admission, bring_up, guest_fixup, snapshot, translation};
use super::cache::{CompileCache, sha256_hex};
use super::engine::PolicyEngine;
use super::error::LoadError;
use super::sandbox::{Sandbox, new_store};
use super::slot::{Slot, WIT_PACKAGE};

/// Where a component came from, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The default compiled into the daemon.
    Builtin(Slot),
    /// A file the operator pointed the slot at.
    File(std::path::PathBuf),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Builtin(slot) => write!(f, "built-in {slot} policy"),
            Origin::File(path) => write!(f, "policy component {}", path.display()),
        }
    }
}

/// A pre-resolved component, ready to instantiate for its slot's world.
pub(crate) enum SlotPre {
    SnapshotBeforeDestroy(snapshot::SnapshotBeforeDestroyPolicyPre<Sandbox>),
    BringUp(bring_up::BringUpPolicyPre<Sandbox>),
    CpuClassAdmission(admission::CpuClassAdmissionPolicyPre<Sandbox>),
    ResourceTranslation(translation::ResourceTranslationPolicyPre<Sandbox>),
    GuestFixup(guest_fixup::GuestFixupPolicyPre<Sandbox>),
}

/// The component-model layer marker in a binary's header (a core module has version 1).
const COMPONENT_LAYER: [u8; 4] = [0x0d, 0x00, 0x01, 0x00];
const WASM_MAGIC: [u8; 4] = *b"\0asm";

/// Compiles (or loads from `cache`) and validates `bytes` for `slot`.
pub(crate) fn load(
    engine: &PolicyEngine,
    cache: Option<&CompileCache>,
    slot: Slot,
    origin: &Origin,
    bytes: &[u8],
) -> Result<(SlotPre, String), LoadError> {
    let corrupt = |detail: String| LoadError::Corrupt {
        origin: origin.to_string(),
        detail,
    };
    match (bytes.get(..4), bytes.get(4..8)) {
        (Some(magic), _) if magic != WASM_MAGIC => {
            return Err(corrupt("it does not start with the WebAssembly magic bytes".into()));
        }
        (Some(_), Some(layer)) if layer != COMPONENT_LAYER => {
            return Err(corrupt(
                "it is a core WebAssembly module, not a component; build it for wasm32-wasip2 (or componentize it)"
                    .into(),
            ));
        }
        (None, _) | (_, None) => return Err(corrupt(format!("it is only {} bytes long", bytes.len()))),
        _ => {}
    }
    let digest = sha256_hex(bytes);
    let component = compile(engine, cache, &digest, bytes).map_err(|e| corrupt(format!("{e:#}")))?;
    check_imports(engine, &component, origin)?;
    check_export(engine, &component, slot, origin)?;
    let mismatch = |e: wasmtime::Error| LoadError::ExportMismatch {
        origin: origin.to_string(),
        slot,
        expected: slot.export_name(),
        detail: format!("{e:#}"),
    };
    let pre = pre_resolve(engine, &component, slot).map_err(mismatch)?;
    pre.trial_instantiate(engine).map_err(mismatch)?;
    Ok((pre, digest))
}

fn compile(
    engine: &PolicyEngine,
    cache: Option<&CompileCache>,
    digest: &str,
    bytes: &[u8],
) -> wasmtime::Result<Component> {
    let wasmtime = engine.wasmtime();
    let Some(cache) = cache else {
        return Component::new(wasmtime, bytes);
    };
    let compat = engine.compatibility_key();
    if let Some(compiled) = cache.get(digest, &compat) {
        // SAFETY: the entry was produced by `precompile_component` of an engine with the same
        // compatibility key, and its SHA-256 was checked; wasmtime also re-checks its header.
        match unsafe { Component::deserialize(wasmtime, &compiled) } {
            Ok(component) => return Ok(component),
            Err(error) => tracing::warn!(%error, "cached policy refused by wasmtime; recompiling"),
        }
    }
    let compiled = wasmtime.precompile_component(bytes)?;
    cache.put(digest, &compat, &compiled);
    // SAFETY: `compiled` was just produced by this engine.
    unsafe { Component::deserialize(wasmtime, &compiled) }
}

/// The contract grants one import and no functions: the `types` interface, which only carries
/// the shared record types (a component that uses them imports it as an instance of types).
/// Anything else, a WASI interface or a host function, is refused: a policy can only compute.
fn check_imports(engine: &PolicyEngine, component: &Component, origin: &Origin) -> Result<(), LoadError> {
    let ty = component.component_type();
    let forbidden: Vec<String> = ty
        .imports(engine.wasmtime())
        .filter(|(name, item)| !(*name == types_import() && is_types_only(engine, &item.ty)))
        .map(|(name, _)| name.to_string())
        .collect();
    if forbidden.is_empty() {
        Ok(())
    } else {
        Err(LoadError::ForbiddenImports {
            origin: origin.to_string(),
            imports: forbidden,
        })
    }
}

/// `cocoonstack:vk-policy/types@<version>`.
fn types_import() -> String {
    let (package, version) = WIT_PACKAGE.split_once('@').expect("package carries a version");
    format!("{package}/types@{version}")
}

/// An instance that exports nothing but (non-resource) types.
fn is_types_only(engine: &PolicyEngine, item: &ComponentItem) -> bool {
    match item {
        ComponentItem::ComponentInstance(instance) => instance
            .exports(engine.wasmtime())
            .all(|(_, export)| matches!(export.ty, ComponentItem::Type(_))),
        _ => false,
    }
}

fn check_export(engine: &PolicyEngine, component: &Component, slot: Slot, origin: &Origin) -> Result<(), LoadError> {
    let ty = component.component_type();
    let expected = slot.export_name();
    let found: Vec<String> = ty
        .exports(engine.wasmtime())
        .map(|(name, _)| name.to_string())
        .collect();
    if found.iter().any(|name| *name == expected) {
        Ok(())
    } else {
        Err(LoadError::WrongWorld {
            origin: origin.to_string(),
            slot,
            expected,
            world: slot.world(),
            found,
        })
    }
}

/// Resolves the (empty) imports and type-checks the slot's exports once, off the hot path.
fn pre_resolve(engine: &PolicyEngine, component: &Component, slot: Slot) -> wasmtime::Result<SlotPre> {
    let mut linker = Linker::<Sandbox>::new(engine.wasmtime());
    // The granted types-only import: an instance with no items satisfies it.
    linker.instance(&types_import())?;
    let pre = linker.instantiate_pre(component)?;
    Ok(match slot {
        Slot::SnapshotBeforeDestroy => {
            SlotPre::SnapshotBeforeDestroy(snapshot::SnapshotBeforeDestroyPolicyPre::new(pre)?)
        }
        Slot::BringUp => SlotPre::BringUp(bring_up::BringUpPolicyPre::new(pre)?),
        Slot::CpuClassAdmission => SlotPre::CpuClassAdmission(admission::CpuClassAdmissionPolicyPre::new(pre)?),
        Slot::ResourceTranslation => SlotPre::ResourceTranslation(translation::ResourceTranslationPolicyPre::new(pre)?),
        Slot::GuestFixup => SlotPre::GuestFixup(guest_fixup::GuestFixupPolicyPre::new(pre)?),
    })
}

impl SlotPre {
    /// Instantiates once in a sandboxed store. Resolving an export only finds it by name;
    /// instantiation type-checks its functions against the slot's world, so a component with
    /// the right names but the wrong signatures is refused at load, not at its first decision.
    fn trial_instantiate(&self, engine: &PolicyEngine) -> wasmtime::Result<()> {
        let _permit = engine.acquire();
        let mut store = new_store(engine);
        match self {
            SlotPre::SnapshotBeforeDestroy(pre) => pre.instantiate(&mut store).map(drop),
            SlotPre::BringUp(pre) => pre.instantiate(&mut store).map(drop),
            SlotPre::CpuClassAdmission(pre) => pre.instantiate(&mut store).map(drop),
            SlotPre::ResourceTranslation(pre) => pre.instantiate(&mut store).map(drop),
            SlotPre::GuestFixup(pre) => pre.instantiate(&mut store).map(drop),
        }
    }
}

/// Which slots a component implements (used by `policy check` without `--slot`).
pub fn implemented_slots(engine: &PolicyEngine, bytes: &[u8]) -> Vec<Slot> {
    Slot::ALL
        .into_iter()
        .filter(|slot| load(engine, None, *slot, &Origin::Builtin(*slot), bytes).is_ok())
        .collect()
}
