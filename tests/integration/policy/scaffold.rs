//! `vk-cocoon policy new SLOT DIR --lang python|js` (issue 40): the scaffold builds with its own
//! `build.sh`, with the toolchains `policies/examples/build.sh` pinned and installed (reused
//! through `VK_POLICY_TOOLCHAINS`, never installed again), and passes its own table in
//! `vk-cocoon policy test DIR`.
//!
//! Every slot is built in JavaScript (~2 s each); Python in one slot only (bring-up, the template
//! with the most of the bindings in it: enums, variants, a refusal), as each componentize-py build
//! takes 10-15 s and each 18 MB component a further ~15 s to compile for its table. Without the
//! toolchains these tests say they are skipped, except under `CI=true`, where that is a failure.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use vk_cocoon::policy::Slot;

/// The toolchains `policies/examples/build.sh` installs (`target/policy-toolchains`, or
/// `$VK_POLICY_TOOLCHAINS`), when both are there.
fn toolchains() -> Option<PathBuf> {
    let dir = std::env::var_os("VK_POLICY_TOOLCHAINS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/policy-toolchains"));
    let python = dir.join("python/bin/componentize-py");
    let qjs = dir.join("js/node_modules/.bin/componentize-qjs");
    if python.exists() && qjs.exists() {
        return Some(dir);
    }
    assert_ne!(
        std::env::var("CI").as_deref(),
        Ok("true"),
        "CI=true, but the policy toolchains are not in {} (policies/examples/build.sh installs them)",
        dir.display()
    );
    eprintln!(
        "skipped: no policy toolchains in {}; run policies/examples/build.sh",
        dir.display()
    );
    None
}

fn vk_cocoon(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vk-cocoon"))
        .args(args)
        .output()
        .expect("run vk-cocoon")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Scaffolds `slot` in `lang`, builds it with its build.sh and runs its table; returns the
/// build's seconds.
fn scaffold_build_and_test(root: &Path, tools: &Path, lang: &str, slot: Slot) -> f64 {
    let name = format!("my-{lang}-{slot}");
    let dir = root.join(&name);
    let out = vk_cocoon(&["policy", "new", slot.name(), dir.to_str().unwrap(), "--lang", lang]);
    assert!(out.status.success(), "{lang} {slot}: {}", text(&out));
    assert!(
        text(&out).contains("build.sh"),
        "the next steps say how to build it: {}",
        text(&out)
    );

    let started = Instant::now();
    let build = Command::new(dir.join("build.sh"))
        .env("VK_POLICY_TOOLCHAINS", tools)
        .output()
        .expect("run build.sh");
    let seconds = started.elapsed().as_secs_f64();
    assert!(
        build.status.success(),
        "{lang} {slot}: build.sh failed: {}",
        text(&build)
    );
    let component = dir.join(format!("{name}.wasm"));
    assert!(
        component.exists(),
        "{lang} {slot}: build.sh wrote no {}",
        component.display()
    );

    let table = std::fs::read_to_string(dir.join(format!("{name}.cases.yaml"))).unwrap();
    let rows = table.matches("\n  - name: ").count();
    assert!(rows > 0, "{lang} {slot}: the table has cases");
    let out = vk_cocoon(&["policy", "test", dir.to_str().unwrap()]);
    let report = text(&out);
    assert!(out.status.success(), "{lang} {slot}: {report}");
    assert!(
        report.contains(&format!("on the policy component {}", component.display())),
        "{lang} {slot}: the table ran against the built component, not the built-in policy: {report}"
    );
    assert!(
        report.contains(&format!("{rows} passed, 0 failed")),
        "{lang} {slot}: {report}"
    );
    seconds
}

#[test]
fn a_javascript_policy_of_every_slot_builds_with_its_build_sh_and_passes_its_own_table() {
    let Some(tools) = toolchains() else { return };
    let root = tempfile::tempdir().unwrap();
    for slot in Slot::ALL {
        let seconds = scaffold_build_and_test(root.path(), &tools, "js", slot);
        eprintln!("js {slot}: built in {seconds:.1} s");
    }
}

#[test]
fn a_python_policy_builds_with_its_build_sh_and_passes_its_own_table() {
    let Some(tools) = toolchains() else { return };
    let root = tempfile::tempdir().unwrap();
    let seconds = scaffold_build_and_test(root.path(), &tools, "python", Slot::BringUp);
    eprintln!("python bring-up: built in {seconds:.1} s");
}

/// Always runs (no toolchain needed): what a scaffold's build.sh builds with is what the
/// examples, and so the suite, are built with.
#[test]
fn a_scaffold_pins_the_examples_toolchains_and_flags() {
    let examples =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/examples/build.sh")).unwrap();
    let pin = |script: &str, tool: &str| -> String {
        script
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{tool}=")))
            .unwrap_or_else(|| panic!("no {tool}= pin in:\n{script}"))
            .to_string()
    };
    let root = tempfile::tempdir().unwrap();
    for (lang, tool, flags) in [
        ("python", "componentize_py", &["--stub-wasi"][..]),
        ("js", "componentize_qjs", &["--stub-wasi", "--sync"][..]),
    ] {
        let dir = root.path().join(format!("pinned-{lang}"));
        let out = vk_cocoon(&["policy", "new", "guest-fixup", dir.to_str().unwrap(), "--lang", lang]);
        assert!(out.status.success(), "{}", text(&out));
        let script = std::fs::read_to_string(dir.join("build.sh")).unwrap();
        assert_eq!(pin(&script, tool), pin(&examples, tool), "{lang}: the pinned {tool}");
        for flag in flags {
            assert!(script.contains(flag), "{lang}: build.sh passes {flag}:\n{script}");
        }
        assert!(
            dir.join("wit/vk-policy.wit").exists() && dir.join(format!("pinned-{lang}.cases.yaml")).exists(),
            "{lang}: the contract and the table are written"
        );
    }
}

#[test]
fn an_unknown_language_is_refused_naming_the_ones_there_are() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("p");
    let out = vk_cocoon(&["policy", "new", "bring-up", dir.to_str().unwrap(), "--lang", "go"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("'go'") && err.contains("--lang") && err.contains("rust, python, js"),
        "{err}"
    );
    assert!(!dir.exists(), "nothing is written for a refused language");
}
