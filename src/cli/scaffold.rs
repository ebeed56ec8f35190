//! `vk-cocoon policy new SLOT DIR [--lang rust|python|js]`: a policy of one slot that builds
//! and passes its own case table as written, so a policy author starts from something that
//! works and changes one rule at a time.
//!
//! Rust: a standalone crate (its own `[workspace]`) for `wasm32-wasip2`, with a copy of the
//! contract (`wit/vk-policy.wit`) and the `no_std` runtime glue the default policies use
//! (allocator, panic handler, `cabi_realloc`: the same source file); it depends only on
//! `wit-bindgen`. Python and JavaScript: the source (`app.py`, `policy.js`), the contract and a
//! `build.sh` that builds `<name>.wasm` beside the table with the toolchain versions and flags
//! `policies/examples/build.sh` uses, so a scaffold builds as the shipped examples do.

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

/// The language a policy is written in (`--lang`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    /// A `no_std` crate built by cargo for `wasm32-wasip2`.
    Rust,
    /// `app.py`, built by componentize-py.
    Python,
    /// `policy.js`, built by componentize-qjs (QuickJS).
    Js,
}

/// The toolchain versions `policies/examples/build.sh` pins (the suite checks they agree): a
/// scaffold is built by the toolchain its examples and tests were built by.
const COMPONENTIZE_PY: &str = "0.25.1";
const COMPONENTIZE_QJS: &str = "0.4.5";

/// A Python or JavaScript policy's source file, its text for `slot` (same decisions, same
/// table as the Rust template) and its build.sh; none for Rust, which is a crate.
fn script(slot: Slot, lang: Lang) -> Option<(&'static str, &'static str, &'static str)> {
    let source = match (slot, lang) {
        (_, Lang::Rust) => return None,
        (Slot::SnapshotBeforeDestroy, Lang::Python) => include_str!("templates/snapshot-before-destroy.py"),
        (Slot::SnapshotBeforeDestroy, Lang::Js) => include_str!("templates/snapshot-before-destroy.js"),
        (Slot::BringUp, Lang::Python) => include_str!("templates/bring-up.py"),
        (Slot::BringUp, Lang::Js) => include_str!("templates/bring-up.js"),
        (Slot::CpuClassAdmission, Lang::Python) => include_str!("templates/cpu-class-admission.py"),
        (Slot::CpuClassAdmission, Lang::Js) => include_str!("templates/cpu-class-admission.js"),
        (Slot::ResourceTranslation, Lang::Python) => include_str!("templates/resource-translation.py"),
        (Slot::ResourceTranslation, Lang::Js) => include_str!("templates/resource-translation.js"),
        (Slot::GuestFixup, Lang::Python) => include_str!("templates/guest-fixup.py"),
        (Slot::GuestFixup, Lang::Js) => include_str!("templates/guest-fixup.js"),
    };
    Some(match lang {
        Lang::Python => ("app.py", source, include_str!("templates/build-python.sh")),
        _ => ("policy.js", source, include_str!("templates/build-js.sh")),
    })
}

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

/// A package name from the directory's name: lower-case letters, digits and `-` (it names the
/// crate, and for every language the table and the component).
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
            "the policy (crate, table, component) is named after its directory, and {name:?} is not a usable name: use a directory name of lower-case letters, digits and '-', starting with a letter"
        );
    }
    Ok(name)
}

/// What was written, for the report.
pub struct Scaffolded {
    pub dir: PathBuf,
    pub package: String,
    pub lang: Lang,
    pub table: PathBuf,
    /// Relative to `dir`: where the build puts the component (the table's `component:`).
    pub component: PathBuf,
}

/// Writes the policy into `dir`, which must not exist or be empty.
pub fn scaffold(slot: Slot, lang: Lang, dir: &Path) -> anyhow::Result<Scaffolded> {
    if dir.exists() && fs::read_dir(dir)?.next().is_some() {
        bail!("{} exists and is not empty: give a new directory", dir.display());
    }
    let package = package_name(dir)?;
    let crate_name = package.replace('-', "_");
    let (lib, table) = template(slot);
    let table_path = dir.join(format!("{package}.cases.yaml"));
    let component = match lang {
        Lang::Rust => Path::new("target/wasm32-wasip2/release").join(format!("{crate_name}.wasm")),
        Lang::Python | Lang::Js => PathBuf::from(format!("{package}.wasm")),
    };
    let table = table.replace("{{COMPONENT}}", &component.to_string_lossy());
    let mut files: Vec<(PathBuf, String)> = vec![
        (dir.join("wit/vk-policy.wit"), CONTRACT.into()),
        (table_path.clone(), table),
    ];
    match script(slot, lang) {
        None => files.extend([
            (dir.join("Cargo.toml"), cargo_toml(&package)),
            (dir.join(".cargo/config.toml"), CARGO_CONFIG.into()),
            (dir.join("src/lib.rs"), lib.into()),
            (dir.join("src/wasm_glue.rs"), WASM_GLUE.into()),
        ]),
        Some((source_name, source, build)) => {
            let build = build
                .replace("{{NAME}}", &package)
                .replace("{{WORLD}}", &slot.world())
                .replace("{{COMPONENTIZE_PY}}", COMPONENTIZE_PY)
                .replace("{{COMPONENTIZE_QJS}}", COMPONENTIZE_QJS);
            files.extend([
                (dir.join(source_name), source.into()),
                (dir.join("build.sh"), build),
                // The toolchain build.sh installs when $VK_POLICY_TOOLCHAINS is unset.
                (dir.join(".gitignore"), ".toolchains/\n".into()),
            ]);
        }
    }
    for (path, text) in &files {
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
        }
        fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    if lang != Lang::Rust {
        make_executable(&dir.join("build.sh"))?;
    }
    Ok(Scaffolded {
        dir: dir.to_path_buf(),
        package,
        lang,
        table: table_path,
        component,
    })
}

fn make_executable(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))
        .with_context(|| format!("cannot make {} executable", path.display()))
}

/// The next steps, printed after scaffolding.
pub fn next_steps(slot: Slot, s: &Scaffolded) -> String {
    let dir = s.dir.display();
    let component = s.component.display();
    let table = s.table.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
    let (what, build) = match s.lang {
        Lang::Rust => (
            format!("crate {}", s.package),
            format!("cd {dir} && cargo build --release --target wasm32-wasip2"),
        ),
        Lang::Python => (
            "Python, app.py".to_string(),
            format!("{dir}/build.sh   (componentize-py {COMPONENTIZE_PY}; set VK_POLICY_TOOLCHAINS to reuse one)"),
        ),
        Lang::Js => (
            "JavaScript, policy.js".to_string(),
            format!("{dir}/build.sh   (componentize-qjs {COMPONENTIZE_QJS}; set VK_POLICY_TOOLCHAINS to reuse one)"),
        ),
    };
    [
        format!(
            "created {dir}: a {slot} policy ({what}) against contract {}",
            ContractVersion::CURRENT
        ),
        String::new(),
        format!("build it:   {build}"),
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
