//! `cocoon-macos-sim`: a simulator of the `cocoon-macos` CLI (QEMU/KVM macOS guests; contracts
//! appendix D, and the public cocoonstack/cocoon-macos sources for the facts below).
//!
//! The same machinery as the `cocoon` simulator: argv parsing ([`crate::cli::parse`]), fault
//! injection and settings (`control.json`), the call log (`calls.log`) and the state lock, all
//! under the state directory — `--state-dir`, else `$COCOON_MACOS_HOME` (the real CLI's), else
//! `/tmp/cocoon-macos-sim` (never the host's `/var/lib/cocoon-macos`).
//!
//! What the real CLI does and the simulator keeps:
//! - `vm inspect NAME` prints the whole `<state>/vms/NAME/vm.json` record (2-space JSON); a
//!   missing one fails with `read vm record: open …/vm.json: no such file or directory`.
//! - `vm run` = create + boot, atomic (a failed boot leaves nothing); it prints `NAME (pid N)`.
//!   `vm start NAME…` boots created or stopped records (the VNC password is never persisted, so
//!   `--vnc-password` must be passed again). `vm rm NAME…` stops and removes, and succeeds for a
//!   name that does not exist (it is an `os.RemoveAll`). Errors print `Error: <msg>`, exit 1.
//! - `--vnc D` with `--net cni` needs `--vnc-password` (≤ 8 characters, no control characters);
//!   the display's TCP port is 5900 + D and is bound before the launch reports success, so a port
//!   another VM holds fails the run (`bind vnc port: …`).
//! - `--storage` below the image's virtual size is refused (no shrinking).
//!
//! Simulator-only: the "qemu" is `cocoon-macos-sim __qemu …`, a real process per running VM whose
//! command line carries the VM's disk path (the real CLI's liveness check). It serves the VNC
//! display on the root's host address `<subnet>.0.1` (loopback; the real CNI proxy listens on all
//! interfaces) and, while `settings.macos_sshd`, an `SSH-2.0-…` banner on the guest's `:22`; the
//! guest's address (`<subnet>.250.N`, what cocoon-net's DHCP would lease to the VM's MAC) is kept
//! in `vms/NAME/sim-guest.json`, outside the record, as the real record has no IP.

pub mod helper;
pub mod qemu;
pub mod record;
pub mod vm;

use crate::cli::Fail;
use crate::control::{Control, FaultAction};
use crate::store::Store;
use std::path::PathBuf;

/// The state directory of this invocation.
pub fn home(argv: &[String]) -> PathBuf {
    let mut it = argv.iter();
    while let Some(a) = it.next() {
        if let Some(v) = a.strip_prefix("--state-dir=") {
            return PathBuf::from(v);
        }
        if a == "--state-dir"
            && let Some(v) = it.next()
        {
            return PathBuf::from(v);
        }
    }
    std::env::var_os("COCOON_MACOS_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/cocoon-macos-sim"))
}

/// Entry point of the binary: returns the exit code.
pub fn run(argv: Vec<String>) -> i32 {
    crate::cli::exit_code(run_inner(argv))
}

/// Where the two command words are (`--state-dir X` may precede them).
fn word_indices(argv: &[String]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < argv.len() && out.len() < 2 {
        if argv[i] == "--state-dir" {
            i += 2;
            continue;
        }
        if !argv[i].starts_with('-') {
            out.push(i);
        }
        i += 1;
    }
    out
}

fn run_inner(argv: Vec<String>) -> Result<(), Fail> {
    let store = Store::new(home(&argv));
    store.ensure_dirs()?;
    let at = word_indices(&argv);
    let words: Vec<&String> = at.iter().map(|&i| &argv[i]).collect();
    let (group, verb) = match words.as_slice() {
        [g, v] => (g.as_str(), v.as_str()),
        _ => {
            return Err(Fail::new(format!(
                "unknown command {:?} for \"cocoon-macos\": expected `vm|image <verb>`",
                words.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(" ")
            )));
        }
    };
    let verb_key = format!("{group} {verb}");
    crate::cli::log_call(&store, &verb_key, &argv)?;
    match Control::take_fault(&store, &verb_key, &argv)? {
        Some(FaultAction::Fail {
            stdout,
            stderr,
            exit_code,
        }) => return Err(crate::cli::injected_failure(&stdout, stderr, exit_code)?),
        Some(FaultAction::Delay { ms }) => std::thread::sleep(std::time::Duration::from_millis(ms)),
        Some(FaultAction::Die { .. }) => crate::cli::die(),
        None => {}
    }
    let control = Control::load(&store)?;
    // Everything after the two command words (flags may come before them too).
    let rest: Vec<String> = argv
        .iter()
        .enumerate()
        .filter(|(i, _)| !at.contains(i))
        .map(|(_, a)| a.clone())
        .collect();
    let ctx = vm::Ctx {
        store,
        settings: control.settings,
    };
    match group {
        "vm" => vm::dispatch(&ctx, verb, &rest),
        "image" => vm::image(&ctx, verb, &rest),
        other => Err(Fail::new(format!("unknown command \"{other}\" for \"cocoon-macos\""))),
    }
}
