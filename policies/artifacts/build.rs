//! Builds the policy guests as `wasm32-wasip2` components with a nested cargo, as wasmtime's
//! test-programs do, and generates `include_bytes!` constants for them.
//!
//! The nested cargo uses its own target directory under `OUT_DIR` (a nested build on the outer
//! target directory would block on its lock) and the release profile (small, fast guests). Every
//! source file the guests were built from is reported back with `rerun-if-changed`, read from the
//! dep-info files the nested build writes.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// (constant name, package) of each default policy.
const DEFAULTS: &[(&str, &str)] = &[
    ("SNAPSHOT_BEFORE_DESTROY", "snapshot-before-destroy-policy"),
    ("BRING_UP", "bring-up-policy"),
    ("CPU_CLASS_ADMISSION", "cpu-class-admission-policy"),
    ("RESOURCE_TRANSLATION", "resource-translation-policy"),
    ("GUEST_FIXUP", "guest-fixup-policy"),
];

/// (constant name, package) of each test guest (hostile ones, a call counter, a custom
/// bring-up policy, a component of an unknown contract version).
const HOSTILE: &[(&str, &str)] = &[
    ("SPIN_FOREVER", "hostile-spin-forever"),
    ("MEMORY_BOMB", "hostile-memory-bomb"),
    ("TRAPPER", "hostile-trapper"),
    ("WRONG_SIGNATURE", "hostile-wrong-signature"),
    ("WASI_IMPORTER", "hostile-wasi-importer"),
    ("CALL_COUNTER", "hostile-call-counter"),
    ("CUSTOM_REFUSER", "test-custom-refuser"),
    ("FUTURE_CONTRACT", "test-future-contract"),
];

const TARGET: &str = "wasm32-wasip2";
/// Link flags of every guest: a 32 KiB stack.
const GUEST_RUSTFLAGS: &str = "-Clink-arg=-zstack-size=32768";

fn main() {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let workspace = manifest_dir
        .ancestors()
        .nth(2)
        .expect("policies/artifacts sits two levels below the workspace");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let target_dir = out_dir.join("wasm");
    let with_hostile = env::var_os("CARGO_FEATURE_HOSTILE").is_some();

    let mut guests: Vec<(&str, &str)> = DEFAULTS.to_vec();
    if with_hostile {
        guests.extend_from_slice(HOSTILE);
    }
    build_guests(workspace, &target_dir, &guests);

    let artifacts = target_dir.join(TARGET).join("release");
    let mut code = String::new();
    for (section, list) in [("defaults", DEFAULTS), ("hostile", HOSTILE)] {
        let enabled = section == "defaults" || with_hostile;
        if !enabled {
            continue;
        }
        writeln!(code, "pub mod {section} {{").unwrap();
        for (constant, package) in list {
            let crate_name = package.replace('-', "_");
            let wasm = artifacts.join(format!("{crate_name}.wasm"));
            assert!(wasm.exists(), "the nested build did not produce {}", wasm.display());
            report_sources(&artifacts.join(format!("{crate_name}.d")));
            writeln!(code, "    /// The `{package}` component.").unwrap();
            writeln!(
                code,
                "    pub const {constant}: &[u8] = include_bytes!({:?});",
                wasm.display().to_string()
            )
            .unwrap();
        }
        writeln!(code, "}}").unwrap();
    }
    fs::write(out_dir.join("artifacts.rs"), code).expect("write generated artifacts.rs");

    println!("cargo:rerun-if-changed={}", workspace.join("wit").display());
    println!("cargo:rerun-if-changed=build.rs");
}

fn build_guests(workspace: &Path, target_dir: &Path, guests: &[(&str, &str)]) {
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .current_dir(workspace)
        .args(["build", "--release", "--target", TARGET])
        .env("CARGO_TARGET_DIR", target_dir)
        // Flags meant for the host build must not leak into the guests. A policy needs a
        // small stack (the default is 1 MiB): a smaller one keeps each instance's memory
        // footprint, and so its reset cost per decision, small.
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .env("CARGO_ENCODED_RUSTFLAGS", GUEST_RUSTFLAGS);
    for (_, package) in guests {
        command.args(["-p", package]);
    }
    let status = command
        .status()
        .expect("run the nested cargo build of the policy guests");
    assert!(
        status.success(),
        "building the policy guests for {TARGET} failed ({status}); if the target is missing, run `rustup target add {TARGET}`"
    );
}

/// Prints `rerun-if-changed` for every source listed in a dep-info file (`out: src src …`).
fn report_sources(dep_info: &Path) {
    let Ok(text) = fs::read_to_string(dep_info) else {
        println!("cargo:rerun-if-changed={}", dep_info.display());
        return;
    };
    for line in text.lines() {
        let Some((_, deps)) = line.split_once(": ") else {
            continue;
        };
        // Paths with spaces are escaped as `\ ` in dep-info files.
        let deps = deps.replace("\\ ", "\u{0}");
        for dep in deps.split_whitespace() {
            let path = dep.replace('\u{0}', " ");
            if !path.contains("/.cargo/registry/") && !path.contains("/rustlib/") {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
}
