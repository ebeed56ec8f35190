//! Shared helpers of the `runtime_*` integration tests: a simulator root plus a client pointed at it.

use cocoon_sim::Sim;
use std::path::PathBuf;
use std::time::Duration;
use vk_cocoon::runtime::{BusyRetry, CocoonCli, CocoonCliConfig, Timeouts, WatchBackoff};

/// The `cocoon-sim` binary: `COCOON_SIM_BIN`, else next to the test executable (`target/debug/cocoon-sim`).
pub fn sim_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("COCOON_SIM_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current_exe");
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|d| d.join("cocoon-sim"))
        .expect("target dir layout");
    if !bin.exists() {
        panic!(
            "cocoon-sim binary not found at {}: run `cargo build -p cocoon-sim` first (or set COCOON_SIM_BIN)",
            bin.display()
        );
    }
    bin
}

/// The daemon's binary, `vk-cocoon`, beside the test executable (`target/<profile>/vk-cocoon`):
/// Cargo builds a package's binaries before its integration tests and benches, in the same
/// profile directory, which is where it points their `CARGO_BIN_EXE_vk-cocoon` (a variable only
/// the package's own test crates see, not this support crate).
pub fn daemon_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|d| d.join("vk-cocoon"))
        .expect("target dir layout");
    assert!(
        bin.exists(),
        "the vk-cocoon binary is not at {}: run the tests through cargo (`cargo test`, `cargo bench`), which builds it",
        bin.display()
    );
    bin
}

/// The `cocoon-macos-sim` binary: `COCOON_MACOS_SIM_BIN`, else beside `cocoon-sim`.
pub fn macos_sim_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("COCOON_MACOS_SIM_BIN") {
        return PathBuf::from(p);
    }
    let bin = sim_bin().with_file_name("cocoon-macos-sim");
    assert!(
        bin.exists(),
        "cocoon-macos-sim binary not found at {}: run `cargo build -p cocoon-sim` first (or set COCOON_MACOS_SIM_BIN)",
        bin.display()
    );
    bin
}

/// A cocoon-macos client for the simulator state directory `mac` (see `Sim::macos`).
pub fn macos_config(mac: &Sim) -> vk_cocoon::runtime::macos::MacosCliConfig {
    vk_cocoon::runtime::macos::MacosCliConfig {
        bin: macos_sim_bin(),
        env: vec![mac.macos_env()],
        query_timeout: Duration::from_secs(20),
        launch_timeout: Duration::from_secs(60),
        launch_grace: Duration::from_secs(5),
        pull_timeout: Duration::from_secs(60),
        ..Default::default()
    }
}

pub struct Harness {
    pub dir: tempfile::TempDir,
    pub sim: Sim,
    pub client: CocoonCli,
}

pub fn config(sim: &Sim) -> CocoonCliConfig {
    CocoonCliConfig {
        bin: sim_bin(),
        sudo: false,
        env: vec![sim.env()],
        timeouts: Timeouts {
            query: Duration::from_secs(20),
            create: Duration::from_secs(60),
            transfer: Duration::from_secs(120),
            exec: Duration::from_secs(30),
        },
        watch_backoff: WatchBackoff {
            initial: Duration::from_millis(50),
            max: Duration::from_millis(400),
            after_clean_end: Duration::from_millis(50),
        },
        busy_retry: BusyRetry {
            interval: Duration::from_millis(100),
            budget: Duration::from_secs(10),
        },
    }
}

pub fn harness() -> Harness {
    harness_with(|_| {})
}

pub fn harness_with(tune: impl FnOnce(&mut CocoonCliConfig)) -> Harness {
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = Sim::new(dir.path()).expect("sim root");
    let mut cfg = config(&sim);
    tune(&mut cfg);
    Harness {
        dir,
        sim,
        client: CocoonCli::new(cfg),
    }
}

/// Waits until `f` is true (polling every 20 ms) or panics after `secs`.
pub async fn eventually(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while !f() {
        if std::time::Instant::now() > deadline {
            panic!("timed out waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
