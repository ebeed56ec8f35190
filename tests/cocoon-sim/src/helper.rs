//! [`Sim`]: the API tests use to set up and drive a simulator root.

use crate::control::{Control, ExecRule, Fault, FaultAction, Settings};
use crate::store::{Resolved, Store};
use crate::subnet;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One recorded `vm exec` (from `<root>/exec.log`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ExecRecord {
    pub vm_id: String,
    pub vm_name: String,
    pub argv: Vec<String>,
    /// `KEY=VALUE` in the order given.
    pub env: Vec<String>,
    pub interactive: bool,
    pub stdin: String,
    pub exit_code: i32,
    pub at: String,
}

/// One recorded invocation (from `<root>/calls.log`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CallRecord {
    pub pid: u32,
    pub verb: String,
    pub argv: Vec<String>,
    /// When it started, on the monotonic clock (ns; [`crate::util::monotonic_ns`]).
    #[serde(default)]
    pub at: u64,
}

/// One invocation that returned (from `<root>/ends.log`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EndRecord {
    pub pid: u32,
    pub verb: String,
    /// When it returned, on the monotonic clock (ns).
    pub at: u64,
}

/// The most of `calls` that ran at once, given when each returned (`ends`, matched by pid and
/// verb: the first end at or after the start). A call without an end (still running, killed,
/// parked) counts as running from its start on.
pub fn most_at_once(calls: &[CallRecord], ends: &[EndRecord]) -> usize {
    let mut edges: Vec<(u64, i8)> = Vec::new();
    for c in calls {
        edges.push((c.at, 1));
        let end = ends
            .iter()
            .filter(|e| e.pid == c.pid && e.verb == c.verb && e.at >= c.at)
            .map(|e| e.at)
            .min();
        if let Some(end) = end {
            edges.push((end, -1));
        }
    }
    // At the same instant an end goes before a start: a turn handed over is not an overlap.
    edges.sort();
    let (mut now, mut most) = (0i64, 0i64);
    for (_, d) in edges {
        now += i64::from(d);
        most = most.max(now);
    }
    most as usize
}

/// Out-of-band VM changes (what a crash, an operator or the host could do behind vk-cocoon's back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flip {
    /// `state: stopped`, pid 0.
    Stopped,
    /// Still recorded `running` but the VMM is dead: printed as `stopped (stale)`.
    Stale,
    /// `state: error`.
    Error,
    /// Back to `running`.
    Running,
    /// The record disappears.
    Deleted,
}

/// A simulator root directory. Point the client at the `cocoon-sim` binary with `COCOON_SIM_ROOT=<root>`.
#[derive(Debug, Clone)]
pub struct Sim {
    pub root: PathBuf,
    /// The root's guest subnet, held while any clone of this handle lives.
    subnet: Arc<subnet::Reservation>,
}

impl Sim {
    /// Uses (and creates) `root`, whose guests get static addresses in a loopback subnet no
    /// other live root on this machine uses (see [`subnet`]).
    pub fn new(root: impl Into<PathBuf>) -> std::io::Result<Sim> {
        let sim = Sim {
            root: root.into(),
            subnet: Arc::new(subnet::reserve()?),
        };
        sim.store().ensure_dirs()?;
        let subnet = sim.subnet().to_string();
        sim.set_settings(|s| s.static_subnet = subnet)?;
        Ok(sim)
    }

    /// A handle on another state directory holding this root's subnet reservation (its
    /// guests share the subnet, so they must not be numbered alike: the cocoon-macos
    /// simulator's are `<subnet>.250.N`).
    pub(crate) fn with_root(&self, root: PathBuf) -> Sim {
        Sim {
            root,
            subnet: self.subnet.clone(),
        }
    }

    /// The first two octets of this root's static guest addresses (`127.N`; its guests are
    /// `127.N.x.y/16`).
    pub fn subnet(&self) -> &str {
        self.subnet.subnet()
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn store(&self) -> Store {
        Store::new(&self.root)
    }

    /// The environment a `cocoon-sim` process needs: `("COCOON_SIM_ROOT", root)`.
    pub fn env(&self) -> (String, String) {
        ("COCOON_SIM_ROOT".into(), self.root.display().to_string())
    }

    /// Makes `verb` (e.g. `"vm inspect"`) fail `times` more times with `stderr` and `exit_code`.
    pub fn inject_failure(&self, verb: &str, times: u32, stderr: &str, exit_code: i32) -> std::io::Result<()> {
        self.add_fault(Fault {
            verb: verb.into(),
            match_arg: None,
            times: Some(times),
            action: FaultAction::Fail {
                stdout: String::new(),
                stderr: stderr.into(),
                exit_code,
            },
        })
    }

    /// Makes `verb` answer the next `times` invocations with exactly `stdout` and exit 0 (fake or old-format outputs).
    pub fn inject_output(&self, verb: &str, times: u32, stdout: &str) -> std::io::Result<()> {
        self.add_fault(Fault {
            verb: verb.into(),
            match_arg: None,
            times: Some(times),
            action: FaultAction::Fail {
                stdout: stdout.into(),
                stderr: String::new(),
                exit_code: 0,
            },
        })
    }

    /// Delays the next `times` invocations of `verb` (`None` = all) by `ms` milliseconds.
    pub fn delay(&self, verb: &str, times: Option<u32>, ms: u64) -> std::io::Result<()> {
        self.add_fault(Fault {
            verb: verb.into(),
            match_arg: None,
            times,
            action: FaultAction::Delay { ms },
        })
    }

    /// Makes the next invocation of `verb` die (SIGKILL) mid-operation (see [`FaultAction::Die`]).
    pub fn die_next(&self, verb: &str, after_bytes: u64) -> std::io::Result<()> {
        self.add_fault(Fault {
            verb: verb.into(),
            match_arg: None,
            times: Some(1),
            action: FaultAction::Die { after_bytes },
        })
    }

    pub fn add_fault(&self, fault: Fault) -> std::io::Result<()> {
        Control::update(&self.store(), |c| c.faults.push(fault))
    }

    pub fn clear_faults(&self) -> std::io::Result<()> {
        Control::update(&self.store(), |c| c.faults.clear())
    }

    /// Fault rules of `verb` with uses left. An invocation logs its call before it takes its
    /// fault, so a test that needs one inside its fault (hanging in a delay, say) waits for the
    /// use to be gone, not for the call: a process killed between the two leaves the fault
    /// armed for the next caller.
    pub fn armed_faults(&self, verb: &str) -> std::io::Result<usize> {
        Ok(Control::load(&self.store())?
            .faults
            .iter()
            .filter(|f| f.verb == verb)
            .count())
    }

    /// What `vm exec` answers for matching commands (first match wins; default: exit 0, stdin echoed with `-i`).
    pub fn on_exec(&self, rule: ExecRule) -> std::io::Result<()> {
        Control::update(&self.store(), |c| c.exec.push(rule))
    }

    pub fn settings(&self) -> std::io::Result<Settings> {
        Ok(Control::load(&self.store())?.settings)
    }

    pub fn set_settings(&self, f: impl FnOnce(&mut Settings)) -> std::io::Result<()> {
        Control::update(&self.store(), |c| f(&mut c.settings))
    }

    /// Changes a VM (by name or ID) behind the client's back.
    pub fn flip_vm(&self, reference: &str, flip: Flip) -> std::io::Result<()> {
        self.store().update(|s| -> std::io::Result<()> {
            let id = match crate::store::resolve(reference, s.vms.iter().map(|(id, e)| (id, e.vm.config.name.as_str())))
            {
                Resolved::Found(id) => id,
                _ => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!("flip_vm: no VM {reference:?} in {}", self.root.display()),
                    ));
                }
            };
            let root = self.root.clone();
            let settings = Control::load_unlocked(&self.store())
                .map(|c| c.settings)
                .unwrap_or_default();
            match flip {
                Flip::Deleted => {
                    if let Some(e) = s.vms.remove(&id) {
                        crate::vmm::stop(&root, &id, e.vm.pid, e.files.as_ref(), true);
                    }
                }
                Flip::Stopped => {
                    crate::vm::mark_stopped(&root, s.vms.get_mut(&id).expect("resolved"), "unexpected-exit")
                }
                Flip::Error => {
                    let e = s.vms.get_mut(&id).expect("resolved");
                    crate::vm::mark_stopped(&root, e, "error");
                    e.vm.state = "error".into();
                }
                Flip::Stale => {
                    // The VMM dies; the record still says running.
                    let e = s.vms.get_mut(&id).expect("resolved");
                    crate::vmm::stop(&root, &id, e.vm.pid, e.files.as_ref(), false);
                    e.vm.state = "running".into();
                    e.stale = true;
                }
                Flip::Running => {
                    let e = s.vms.get_mut(&id).expect("resolved");
                    crate::vm::boot(&root, &settings, e, &crate::util::now_rfc3339(), "restart")
                        .map_err(|f| std::io::Error::other(f.msg))?;
                }
            }
            Ok(())
        })
    }

    fn vm_files(&self, reference: &str) -> std::io::Result<(String, String, String, i64, crate::vmm::VmFiles)> {
        self.store()
            .read(|s| {
                match crate::store::resolve(reference, s.vms.iter().map(|(id, e)| (id, e.vm.config.name.as_str()))) {
                    Resolved::Found(id) => {
                        let e = &s.vms[&id];
                        e.files.clone().map(|f| {
                            (
                                id.clone(),
                                e.vm.hypervisor.clone(),
                                e.vm.config.name.clone(),
                                e.vm.pid,
                                f,
                            )
                        })
                    }
                    _ => None,
                }
            })?
            .ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("no booted VM {reference:?} in {}", self.root.display()),
                )
            })
    }

    /// Appends `msg` to the VM's hypervisor log, in the backend's line format (what the
    /// hypervisor would log now).
    pub fn append_vm_log(&self, reference: &str, msg: &str) -> std::io::Result<()> {
        let (_, hypervisor, name, _, files) = self.vm_files(reference)?;
        crate::vmm::append_log(&files, &crate::vmm::log_line(&hypervisor, &name, files.started_ns, msg))
    }

    /// Appends raw text to the VM's hypervisor log.
    pub fn append_vm_log_raw(&self, reference: &str, text: &str) -> std::io::Result<()> {
        let (_, _, _, _, files) = self.vm_files(reference)?;
        use std::io::Write;
        std::fs::OpenOptions::new()
            .append(true)
            .open(&files.log_file)?
            .write_all(text.as_bytes())
    }

    /// Sets the VM scope's CPU accounting (what the kernel would count).
    pub fn set_cpu_stat(
        &self,
        reference: &str,
        usage_usec: u64,
        throttled_usec: u64,
        nr_throttled: u64,
    ) -> std::io::Result<()> {
        let (_, _, _, _, files) = self.vm_files(reference)?;
        crate::vmm::write_cpu_stat(&files, usage_usec, throttled_usec, nr_throttled)
    }

    /// The VM's files (run dir, log file, cgroup scope) and its VMM's pid.
    pub fn vm_files_of(&self, reference: &str) -> std::io::Result<(crate::vmm::VmFiles, i64)> {
        self.vm_files(reference).map(|(_, _, _, pid, f)| (f, pid))
    }

    /// Kills the VMM of every VM in this root (the test is over).
    pub fn stop_all_vmms(&self) -> std::io::Result<()> {
        let root = self.root.clone();
        self.store().read(|s| {
            for (id, e) in &s.vms {
                crate::vmm::stop(&root, id, e.vm.pid, e.files.as_ref(), false);
            }
        })
    }

    /// Registers an image as if `image pull` had run (`kind`: `oci` or `cloudimg`).
    pub fn add_image(&self, name: &str, kind: &str) -> std::io::Result<()> {
        self.store().update(|s| -> std::io::Result<()> {
            crate::image::add_image(s, name, kind, 64 << 20);
            Ok(())
        })
    }

    pub fn exec_log(&self) -> std::io::Result<Vec<ExecRecord>> {
        self.store().read_jsonl("exec.log")
    }

    pub fn calls(&self) -> std::io::Result<Vec<CallRecord>> {
        self.store().read_jsonl("calls.log")
    }

    /// When each invocation returned (`ends.log`).
    pub fn call_ends(&self) -> std::io::Result<Vec<EndRecord>> {
        self.store().read_jsonl("ends.log")
    }

    /// The most invocations of `verb` (e.g. "vm clone") that ran at once so far.
    pub fn most_at_once(&self, verb: &str) -> std::io::Result<usize> {
        let calls: Vec<CallRecord> = self.calls()?.into_iter().filter(|c| c.verb == verb).collect();
        let ends: Vec<EndRecord> = self.call_ends()?.into_iter().filter(|e| e.verb == verb).collect();
        Ok(most_at_once(&calls, &ends))
    }

    /// Stages a crash: the counted invocations from now on run up to the `after`-th (which,
    /// with `inside`, does its work and parks instead of answering); every later one parks
    /// (see [`crate::control::Crash`]). `crash.log` starts afresh.
    pub fn stage_crash(&self, after: u64, inside: bool) -> std::io::Result<()> {
        let _ = std::fs::remove_file(self.root.join("crash.log"));
        Control::update(&self.store(), |c| {
            c.crash = Some(crate::control::Crash { after, inside, seen: 0 })
        })
    }

    /// Withdraws a staged crash: invocations run normally again and a parked one left over kills
    /// itself without answering.
    pub fn clear_crash(&self) -> std::io::Result<()> {
        Control::update(&self.store(), |c| c.crash = None)
    }

    /// The counted invocations under the staged crash that finished or parked (`crash.log`).
    pub fn crash_log(&self) -> std::io::Result<Vec<crate::cli::CrashLine>> {
        self.store().read_jsonl("crash.log")
    }

    /// Every VM and registered snapshot that came or went, oldest first (`journal.log`).
    pub fn journal(&self) -> std::io::Result<Vec<crate::store::JournalLine>> {
        self.store().read_jsonl("journal.log")
    }

    /// Every event a `vm status --event` process printed, oldest first (`events.log`).
    pub fn emitted_events(&self) -> std::io::Result<Vec<crate::events::EmittedEvent>> {
        self.store().read_jsonl("events.log")
    }

    /// Whether a live `vm status --event` stream last reported VM `id` in `state`: from then on
    /// it notices the VM's next change (it compares each poll with what it last reported), so a
    /// test can change the VM and know the watcher will hear of it.
    pub fn stream_reports(&self, id: &str, state: &str) -> std::io::Result<bool> {
        let live = self.pids_of("vm status")?;
        Ok(self
            .emitted_events()?
            .iter()
            .rev()
            .find(|e| e.vm_id == id && live.contains(&(e.pid as i32)))
            .is_some_and(|e| e.state == state && e.event != "DELETED"))
    }

    /// Raw state of one VM as stored (not reconciled), if present.
    pub fn vm_state(&self, reference: &str) -> std::io::Result<Option<String>> {
        self.store().read(|s| {
            match crate::store::resolve(reference, s.vms.iter().map(|(id, e)| (id, e.vm.config.name.as_str()))) {
                Resolved::Found(id) => Some(s.vms[&id].vm.state.clone()),
                _ => None,
            }
        })
    }

    pub fn vm_count(&self) -> std::io::Result<usize> {
        self.store().read(|s| s.vms.len())
    }

    /// Whether a running export holds the lease of snapshot `reference` (name or ID): while it
    /// does, `snapshot rm` refuses with `is in use by an active export`.
    pub fn snapshot_leased(&self, reference: &str) -> std::io::Result<bool> {
        let id = self.store().read(|s| {
            s.snapshots
                .iter()
                .find(|(id, e)| *id == reference || e.record.config.name == reference)
                .map(|(id, _)| id.clone())
        })?;
        let Some(id) = id else { return Ok(false) };
        let lease = self.root.join("snapshots").join(format!("{id}.lease"));
        let file = match std::fs::OpenOptions::new().read(true).write(true).open(&lease) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        // A shared lock is held by every export; an exclusive try fails while one runs.
        Ok(file.try_lock().is_err())
    }

    /// Data directory of a snapshot (by name or ID).
    pub fn snapshot_dir(&self, reference: &str) -> std::io::Result<Option<PathBuf>> {
        self.store().read(|s| {
            s.snapshots
                .iter()
                .find(|(id, e)| *id == reference || e.record.config.name == reference)
                .map(|(_, e)| PathBuf::from(&e.data_dir))
        })
    }

    /// PIDs of live `cocoon-sim` processes running `verb` (e.g. `"vm status"`).
    pub fn pids_of(&self, verb: &str) -> std::io::Result<Vec<i32>> {
        self.live_pids(|v| v == verb)
    }

    /// The live `cocoon-sim` processes of this root whose verb passes `wanted` (stale records
    /// are cleaned up on the way).
    fn live_pids(&self, wanted: impl Fn(&str) -> bool) -> std::io::Result<Vec<i32>> {
        let mut pids = Vec::new();
        for e in std::fs::read_dir(self.root.join("procs"))? {
            let e = e?;
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let alive = std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains("cocoon-sim"))
                .unwrap_or(false);
            if !alive {
                let _ = std::fs::remove_file(e.path());
                continue;
            }
            if std::fs::read_to_string(e.path()).is_ok_and(|v| wanted(&v)) {
                pids.push(pid);
            }
        }
        Ok(pids)
    }

    /// SIGKILLs every live `cocoon-sim` process of this root, whatever its verb (for a test's
    /// cleanup: a client killed with SIGKILL leaves its children, e.g. an endless
    /// `vm status --event`, running); returns how many.
    pub fn kill_everything(&self) -> std::io::Result<usize> {
        let pids = self.live_pids(|_| true)?;
        for pid in &pids {
            unsafe {
                libc::kill(*pid, libc::SIGKILL);
            }
        }
        Ok(pids.len())
    }

    /// Bytes waiting unread in the stdin pipe of the live process running `verb` (e.g. a
    /// delayed `snapshot import` its feeder writes into), `None` without such a process. Lets a
    /// test act once a stream is under way instead of after a guessed time.
    pub fn stdin_pending(&self, verb: &str) -> std::io::Result<Option<usize>> {
        use std::os::unix::fs::OpenOptionsExt;
        use std::os::unix::io::AsRawFd;
        for pid in self.pids_of(verb)? {
            // Opening the pipe through /proc gives another reader of it; nothing is read.
            let Ok(pipe) = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(format!("/proc/{pid}/fd/0"))
            else {
                continue;
            };
            let mut pending: libc::c_int = 0;
            if unsafe { libc::ioctl(pipe.as_raw_fd(), libc::FIONREAD, &mut pending) } == 0 {
                return Ok(Some(pending.max(0) as usize));
            }
        }
        Ok(None)
    }

    /// SIGKILLs every live `cocoon-sim` process running `verb`; returns how many.
    pub fn kill_all(&self, verb: &str) -> std::io::Result<usize> {
        let pids = self.pids_of(verb)?;
        for pid in &pids {
            unsafe {
                libc::kill(*pid, libc::SIGKILL);
            }
        }
        Ok(pids.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(pid: u32, at: u64) -> CallRecord {
        CallRecord {
            pid,
            verb: "vm clone".into(),
            argv: vec![],
            at,
        }
    }

    fn end(pid: u32, at: u64) -> EndRecord {
        EndRecord {
            pid,
            verb: "vm clone".into(),
            at,
        }
    }

    #[test]
    fn calls_that_overlap_count_together_and_one_handed_over_does_not() {
        // 1 runs 0..10, 2 runs 5..20, 3 starts when 1 ends (10..30), 4 never returns (25..).
        let calls = [call(1, 0), call(2, 5), call(3, 10), call(4, 25)];
        let ends = [end(1, 10), end(2, 20), end(3, 30)];
        assert_eq!(most_at_once(&calls, &ends), 2);
        // Without its end, 1 runs on and overlaps 2 and 3.
        assert_eq!(most_at_once(&calls, &ends[1..]), 3);
        // A reused pid: the end before a call's start is not its end.
        assert_eq!(most_at_once(&[call(7, 50)], &[end(7, 40)]), 1);
    }
}
