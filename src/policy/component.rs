//! Loading a policy component for a slot: compile (or take it from the cache), find which
//! contract version it was built against, check that it imports nothing but that version's
//! `types` and exports the slot's interface with the right types, and pre-resolve it so each
//! decision only instantiates.

use std::fmt;

use wasmtime::component::types::ComponentItem;
use wasmtime::component::{Component, Linker};

use super::cache::{CompileCache, sha256_hex};
use super::contract::ContractVersion;
use super::engine::{PolicyEngine, PoolSize};
use super::error::LoadError;
use super::sandbox::{Sandbox, new_store};
use super::shape::ComponentShape;
use super::slots::{PolicySlot, Slot, WorldPre};

/// Where a component came from, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The default compiled into the daemon.
    Builtin(Slot),
    /// A file the operator pointed the slot at.
    File(std::path::PathBuf),
    /// An artifact in a registry, pinned at the digest that was fetched.
    Oci(super::distribution::PolicyRef),
}

impl Origin {
    /// Where the component came from, as the Node shows it: `builtin`, `file:PATH` or the pinned
    /// `oci://` reference.
    pub fn source(&self) -> String {
        match self {
            Origin::Builtin(_) => "builtin".into(),
            Origin::File(path) => format!("file:{}", path.display()),
            Origin::Oci(reference) => reference.to_string(),
        }
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Builtin(slot) => write!(f, "built-in {slot} policy"),
            Origin::File(path) => write!(f, "policy component {}", path.display()),
            Origin::Oci(reference) => write!(f, "policy artifact {reference}"),
        }
    }
}

/// A component bound to one contract version of its slot's world.
pub(crate) enum Bound<S: PolicySlot> {
    Current(S::Pre),
    V0_1(S::V0_1Pre),
    V0_2(S::V0_2Pre),
}

/// The component-model layer marker in a binary's header (a core module has version 1).
const COMPONENT_LAYER: [u8; 4] = [0x0d, 0x00, 0x01, 0x00];
const WASM_MAGIC: [u8; 4] = *b"\0asm";

/// A compiled component whose header and shape were checked, and the pool it runs in.
pub(crate) struct Compiled {
    pub component: Component,
    pub digest: String,
    pub size: PoolSize,
}

/// Compiles (or loads from `cache`) `bytes` after checking they are a component.
pub(crate) fn compile(
    engine: &PolicyEngine,
    cache: Option<&CompileCache>,
    origin: &Origin,
    bytes: &[u8],
) -> Result<Compiled, LoadError> {
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
    let shape = ComponentShape::read(bytes).map_err(corrupt)?;
    let size = engine.place(&shape).map_err(|detail| LoadError::TooLarge {
        origin: origin.to_string(),
        detail,
    })?;
    let digest = sha256_hex(bytes);
    let component = compile_cached(engine, cache, &digest, bytes, size).map_err(|e| corrupt(compile_error(&e)))?;
    Ok(Compiled {
        component,
        digest,
        size,
    })
}

/// A compile error, with what to do about the one jco's and componentize-qjs's default output
/// meets: the host does not enable the component-model async ABI (a policy decides
/// synchronously, and the async ABI would need a Tokio-driven store per decision).
fn compile_error(error: &wasmtime::Error) -> String {
    let text = format!("{error:#}");
    if text.contains("component model async") {
        format!(
            "{text}; the policy sandbox runs components synchronously: build it without the async ABI (componentize-qjs --sync)"
        )
    } else {
        text
    }
}

/// Validates a compiled component for slot `S` and binds it to the contract version it exports.
pub(crate) fn bind<S: PolicySlot>(
    engine: &PolicyEngine,
    compiled: &Compiled,
    origin: &Origin,
) -> Result<(Bound<S>, ContractVersion), LoadError> {
    let component = &compiled.component;
    // Imports first: a component that imports WASI is refused for that, whatever it exports.
    let any_types: Vec<String> = ContractVersion::SPOKEN.map(|v| v.interface("types")).to_vec();
    check_imports(component, &any_types, origin)?;
    let version = export_version(component, S::SLOT, origin)?;
    check_imports(component, &[version.interface("types")], origin)?;
    let mismatch = |e: wasmtime::Error| LoadError::ExportMismatch {
        origin: origin.to_string(),
        slot: S::SLOT,
        expected: S::SLOT.export_name(version),
        detail: format!("{e:#}"),
    };
    let mut linker = Linker::<Sandbox>::new(component.engine());
    // The granted types-only import: an instance with no items satisfies it.
    linker.instance(&version.interface("types")).map_err(mismatch)?;
    let pre = linker.instantiate_pre(component).map_err(mismatch)?;
    // Resolving an export only finds it by name; instantiating type-checks its functions
    // against the slot's world, so a component with the right names but the wrong signatures
    // is refused here, not at its first decision.
    // The pool has the last word on the instance's shape (nested components instantiated more
    // than once count more than their bytes show): its refusal names the settings too.
    let trial_error = |e: wasmtime::Error| {
        let text = format!("{e:#}");
        if text.contains("pooling allocator") {
            LoadError::TooLarge {
                origin: origin.to_string(),
                detail: format!(
                    "{text}; the limits are limits.max-core-instances, max-memories, max-tables and max-table-elements in the policy configuration (VK_POLICY_MAX_CORE_INSTANCES, …)"
                ),
            }
        } else {
            mismatch(e)
        }
    };
    let size = compiled.size;
    let bound = match version {
        ContractVersion::V0_3_0 => {
            let pre = S::Pre::new(pre).map_err(mismatch)?;
            trial(engine, size, &pre).map_err(trial_error)?;
            Bound::Current(pre)
        }
        ContractVersion::V0_2_0 => {
            let pre = S::V0_2Pre::new(pre).map_err(mismatch)?;
            trial(engine, size, &pre).map_err(trial_error)?;
            Bound::V0_2(pre)
        }
        ContractVersion::V0_1_0 => {
            let pre = S::V0_1Pre::new(pre).map_err(mismatch)?;
            trial(engine, size, &pre).map_err(trial_error)?;
            Bound::V0_1(pre)
        }
    };
    Ok((bound, version))
}

fn trial<P: WorldPre>(engine: &PolicyEngine, size: PoolSize, pre: &P) -> wasmtime::Result<()> {
    let permit = engine.acquire(size)?;
    let mut store = new_store(engine, &permit);
    pre.instantiate(&mut store).map(drop)
}

fn compile_cached(
    engine: &PolicyEngine,
    cache: Option<&CompileCache>,
    digest: &str,
    bytes: &[u8],
    size: PoolSize,
) -> wasmtime::Result<Component> {
    let Some(cache) = cache else {
        return engine.compile(bytes, size).map(|(component, _)| component);
    };
    let compat = engine.compatibility_key();
    if let Some(compiled) = cache.get(digest, &compat) {
        match engine.load_cached(&compiled, size) {
            Ok(component) => return Ok(component),
            Err(error) => tracing::warn!(%error, "cached policy refused by wasmtime; recompiling"),
        }
    }
    let (component, compiled) = engine.compile(bytes, size)?;
    cache.put(digest, &compat, &compiled);
    Ok(component)
}

/// `(interface name, version)` of every `cocoonstack:vk-policy/<name>@<version>` export.
pub(crate) fn contract_exports(component: &Component) -> Vec<(String, String)> {
    let prefix = format!("{}/", ContractVersion::PACKAGE);
    component
        .component_type()
        .exports(component.engine())
        .filter_map(|(name, _)| {
            let (iface, version) = name.strip_prefix(&prefix)?.split_once('@')?;
            Some((iface.to_string(), version.to_string()))
        })
        .collect()
}

/// The contract version of the component's export for `slot`: the newest spoken one if it
/// exports several; an error naming the versions the host speaks if it exports only others.
fn export_version(component: &Component, slot: Slot, origin: &Origin) -> Result<ContractVersion, LoadError> {
    let exports = contract_exports(component);
    let versions: Vec<&str> = exports
        .iter()
        .filter(|(iface, _)| iface == slot.name())
        .map(|(_, version)| version.as_str())
        .collect();
    if let Some(version) = versions.iter().filter_map(|v| ContractVersion::parse(v)).max() {
        return Ok(version);
    }
    if let Some(found) = versions.first() {
        return Err(LoadError::UnsupportedVersion {
            origin: origin.to_string(),
            slot,
            found: format!("{}@{found}", ContractVersion::PACKAGE),
            spoken: ContractVersion::spoken_list(),
        });
    }
    Err(LoadError::WrongWorld {
        origin: origin.to_string(),
        slot,
        expected: slot.export_name(ContractVersion::CURRENT),
        world: slot.world(),
        found: component
            .component_type()
            .exports(component.engine())
            .map(|(name, _)| name.to_string())
            .collect(),
    })
}

/// The contract grants one import and no functions: the `types` interface of the component's
/// own contract version (one of `granted`), which only carries types (a component that uses
/// them imports it as an instance of types). Anything else, a WASI interface or a host
/// function, is refused: a policy can only compute.
fn check_imports(component: &Component, granted: &[String], origin: &Origin) -> Result<(), LoadError> {
    let forbidden: Vec<String> = component
        .component_type()
        .imports(component.engine())
        .filter(|(name, item)| !(granted.iter().any(|g| g == name) && is_types_only(component.engine(), &item.ty)))
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

/// An instance that exports nothing but (non-resource) types.
fn is_types_only(engine: &wasmtime::Engine, item: &ComponentItem) -> bool {
    match item {
        ComponentItem::ComponentInstance(instance) => instance
            .exports(engine)
            .all(|(_, export)| matches!(export.ty, ComponentItem::Type(_))),
        _ => false,
    }
}
