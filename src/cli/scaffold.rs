//! `vk-cocoon policy new SLOT DIR`: a guest crate for one slot that builds for `wasm32-wasip2`
//! and passes its own case table as written, so a policy author starts from something that
//! works and changes one rule at a time.
//!
//! The crate is standalone (its own `[workspace]`), carries a copy of the contract
//! (`wit/vk-policy.wit`) and the `no_std` runtime glue the default policies use (allocator,
//! panic handler, `cabi_realloc`: the same source file), and depends only on `wit-bindgen`.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use vk_cocoon::policy::{ContractVersion, Slot};

/// The contract the crate is generated against.
const CONTRACT: &str = include_str!("../../wit/vk-policy.wit");
/// The default policies' `no_std` glue, verbatim.
const WASM_GLUE: &str = include_str!("../../policies/support/src/wasm_glue.rs");
/// Link flags of every guest (as `policies/artifacts/build.rs` builds the defaults): a 32 KiB
/// stack keeps each instance, and so each decision, small.
const CARGO_CONFIG: &str = r#"[target.wasm32-wasip2]
rustflags = ["-Clink-arg=-zstack-size=32768"]
"#;

/// The starting policy and its case table for `slot`. Every slot has one: adding a slot
/// without a template does not compile.
fn template(slot: Slot) -> (&'static str, &'static str) {
    match slot {
        Slot::SnapshotBeforeDestroy => (
            include_str!("templates/snapshot-before-destroy.rs"),
            include_str!("templates/snapshot-before-destroy.cases.yaml"),
        ),
        Slot::BringUp => (
            include_str!("templates/bring-up.rs"),
            include_str!("templates/bring-up.cases.yaml"),
        ),
        Slot::CpuClassAdmission => (
            include_str!("templates/cpu-class-admission.rs"),
            include_str!("templates/cpu-class-admission.cases.yaml"),
        ),
        Slot::ResourceTranslation => (
            include_str!("templates/resource-translation.rs"),
            include_str!("templates/resource-translation.cases.yaml"),
        ),
        Slot::GuestFixup => (
            include_str!("templates/guest-fixup.rs"),
            include_str!("templates/guest-fixup.cases.yaml"),
        ),
    }
}

fn cargo_toml(package: &str) -> String {
    format!(
        r#"[package]
name = "{package}"
version = "0.1.0"
edition = "2024"
publish = false

[lib]
# cdylib: the component; rlib: the same code under a native `cargo test`.
crate-type = ["cdylib", "rlib"]
# The generated bindings carry doc examples that are not tests of this crate.
doctest = false

[dependencies]
wit-bindgen = {{ version = "0.61", default-features = false, features = ["macros"] }}

# A policy crate stands alone, even when created inside another workspace.
[workspace]
"#
    )
}

/// A package name from the directory's name: lower-case letters, digits and `-`.
fn package_name(dir: &Path) -> anyhow::Result<String> {
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("{} has no usable final component to name the crate", dir.display()))?
        .to_ascii_lowercase()
        .replace('_', "-");
    let valid = name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !valid {
        bail!(
            "the crate is named after its directory, and {name:?} is not a crate name: use a directory name of lower-case letters, digits and '-', starting with a letter"
        );
    }
    Ok(name)
}

/// What was written, for the report.
pub struct Scaffolded {
    pub dir: PathBuf,
    pub package: String,
    pub table: PathBuf,
    pub component: PathBuf,
}

/// Writes the crate into `dir`, which must not exist or be empty.
pub fn scaffold(slot: Slot, dir: &Path) -> anyhow::Result<Scaffolded> {
    if dir.exists() && fs::read_dir(dir)?.next().is_some() {
        bail!("{} exists and is not empty: give a new directory", dir.display());
    }
    let package = package_name(dir)?;
    let crate_name = package.replace('-', "_");
    let (lib, table) = template(slot);
    let table_path = dir.join(format!("{package}.cases.yaml"));
    let files: [(PathBuf, String); 6] = [
        (dir.join("Cargo.toml"), cargo_toml(&package)),
        (dir.join(".cargo/config.toml"), CARGO_CONFIG.into()),
        (dir.join("wit/vk-policy.wit"), CONTRACT.into()),
        (dir.join("src/lib.rs"), lib.into()),
        (dir.join("src/wasm_glue.rs"), WASM_GLUE.into()),
        (table_path.clone(), table.replace("{{CRATE}}", &crate_name)),
    ];
    for (path, text) in &files {
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
        }
        fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(Scaffolded {
        dir: dir.to_path_buf(),
        package,
        table: table_path,
        component: Path::new("target/wasm32-wasip2/release").join(format!("{crate_name}.wasm")),
    })
}

/// The next steps, printed after scaffolding.
pub fn next_steps(slot: Slot, s: &Scaffolded) -> String {
    let dir = s.dir.display();
    let component = s.component.display();
    let table = s.table.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
    [
        format!(
            "created {dir}: a {slot} policy (crate {}) against contract {}",
            s.package,
            ContractVersion::CURRENT
        ),
        String::new(),
        format!("build it:   cd {dir} && cargo build --release --target wasm32-wasip2"),
        format!("test it:    vk-cocoon policy test {dir}   (runs {table} against {component})"),
        format!("check it:   vk-cocoon policy check {dir}/{component} --slot {slot}"),
        "deploy it:  install the component and its table side by side (NAME.wasm, NAME.cases.yaml)".into(),
        format!(
            "            and set {}=/path/NAME.wasm: the table then guards every swap",
            slot.env_var()
        ),
    ]
    .join("\n")
}
