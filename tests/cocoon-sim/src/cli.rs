//! argv parsing (cobra-like) and verb dispatch.

use crate::control::{Control, CrashStep, FaultAction};
use crate::store::Store;
use serde::Serialize;
use std::collections::HashMap;
use std::io::Write;

/// A failure: printed as `Error: <msg>` (or verbatim when `raw`) on stderr, exit `code`.
#[derive(Debug)]
pub struct Fail {
    pub msg: String,
    pub code: i32,
    pub raw: bool,
}

impl Fail {
    pub fn new(msg: impl Into<String>) -> Self {
        Fail {
            msg: msg.into(),
            code: 1,
            raw: false,
        }
    }
    /// Exit with `code` and print nothing (a `vm exec` child's status).
    pub fn silent(code: i32) -> Self {
        Fail {
            msg: String::new(),
            code,
            raw: true,
        }
    }
}

impl From<std::io::Error> for Fail {
    fn from(e: std::io::Error) -> Self {
        Fail::new(e.to_string())
    }
}

pub type Res = Result<(), Fail>;

#[derive(Clone, Copy, PartialEq)]
pub enum Kind {
    Bool,
    Value,
    Repeat,
}

pub type FlagSpec = &'static [(&'static str, Option<char>, Kind)];

const GLOBAL: FlagSpec = &[
    ("config", None, Kind::Value),
    ("root-dir", None, Kind::Value),
    ("run-dir", None, Kind::Value),
    ("log-dir", None, Kind::Value),
    ("cni-conf-dir", None, Kind::Value),
    ("cni-bin-dir", None, Kind::Value),
    ("dns", None, Kind::Value),
    ("log-level", None, Kind::Value),
];

#[derive(Debug, Default)]
pub struct Args {
    pub flags: HashMap<String, Vec<String>>,
    pub positionals: Vec<String>,
    /// Everything after `--`.
    pub rest: Vec<String>,
    pub saw_dashdash: bool,
}

impl Args {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.flags.get(name).and_then(|v| v.last()).map(String::as_str)
    }
    pub fn has(&self, name: &str) -> bool {
        self.flags
            .get(name)
            .is_some_and(|v| v.last().is_none_or(|x| x != "false"))
    }
    pub fn all(&self, name: &str) -> Vec<String> {
        self.flags.get(name).cloned().unwrap_or_default()
    }
    pub fn int(&self, name: &str) -> Result<Option<i64>, Fail> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v.parse::<i64>().map(Some).map_err(|_| {
                Fail::new(format!(
                    "invalid argument \"{v}\" for \"--{name}\" flag: strconv.ParseInt: parsing \"{v}\": invalid syntax"
                ))
            }),
        }
    }
}

/// Parses flags of one verb; global flags are accepted anywhere.
pub fn parse(tokens: &[String], spec: FlagSpec) -> Result<Args, Fail> {
    let mut args = Args::default();
    let find_long = |n: &str| spec.iter().chain(GLOBAL.iter()).find(|(l, _, _)| *l == n).copied();
    let find_short = |c: char| spec.iter().find(|(_, s, _)| *s == Some(c)).copied();
    let mut i = 0;
    while i < tokens.len() {
        let t = &tokens[i];
        i += 1;
        if t == "--" {
            args.saw_dashdash = true;
            args.rest = tokens[i..].to_vec();
            break;
        }
        let (def, inline) = if let Some(long) = t.strip_prefix("--") {
            let (name, inline) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (long, None),
            };
            (
                find_long(name).ok_or_else(|| Fail::new(format!("unknown flag: --{name}")))?,
                inline,
            )
        } else if t.len() > 1 && t.starts_with('-') {
            let mut chars = t[1..].chars();
            let c = chars.next().unwrap_or('-');
            let tail: String = chars.collect();
            let def = find_short(c).ok_or_else(|| Fail::new(format!("unknown shorthand flag: '{c}' in {t}")))?;
            let inline = if tail.is_empty() {
                None
            } else {
                Some(tail.trim_start_matches('=').to_string())
            };
            (def, inline)
        } else {
            args.positionals.push(t.clone());
            continue;
        };
        let (name, _, kind) = def;
        let value = match kind {
            Kind::Bool => inline.unwrap_or_else(|| "true".into()),
            Kind::Value | Kind::Repeat => match inline {
                Some(v) => v,
                None => {
                    let v = tokens
                        .get(i)
                        .cloned()
                        .ok_or_else(|| Fail::new(format!("flag needs an argument: --{name}")))?;
                    i += 1;
                    v
                }
            },
        };
        args.flags.entry(name.to_string()).or_default().push(value);
    }
    Ok(args)
}

/// What a verb needs: the store, the control settings and an optional "die" point.
pub struct Ctx {
    pub store: Store,
    pub control: Control,
    pub die_after: Option<u64>,
}

impl Ctx {
    /// Kills this process (SIGKILL) if a `die` fault is armed.
    pub fn die_here(&self) {
        if self.die_after.is_some() {
            die();
        }
    }
}

pub fn die() -> ! {
    let _ = std::io::stdout().flush();
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    std::process::abort()
}

pub fn print_json(value: &impl Serialize) -> Res {
    let mut out = serde_json::to_string_pretty(value).map_err(|e| Fail::new(e.to_string()))?;
    out.push('\n');
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(out.as_bytes())?;
    stdout.flush()?;
    Ok(())
}

pub fn log(msg: &str) {
    eprintln!("{msg}");
}

#[derive(Serialize)]
struct CallLine<'a> {
    pid: u32,
    verb: &'a str,
    argv: &'a [String],
    /// When it started, on the monotonic clock (ns).
    at: u64,
}

/// Records one invocation in `calls.log` (the tests' view of what the daemon ran), the same line
/// for both simulated CLIs.
pub(crate) fn log_call(store: &Store, verb: &str, argv: &[String]) -> std::io::Result<()> {
    store.append_jsonl(
        "calls.log",
        &CallLine {
            pid: std::process::id(),
            verb,
            argv,
            at: crate::util::monotonic_ns(),
        },
    )
}

#[derive(Serialize)]
struct EndLine<'a> {
    pid: u32,
    verb: &'a str,
    /// When it returned, on the monotonic clock (ns).
    at: u64,
}

/// Records in `ends.log` that this invocation returned (one killed or parked never does): with
/// `calls.log`, how long each call ran and which ran at once.
pub(crate) fn log_end(store: &Store, verb: &str) {
    let _ = store.append_jsonl(
        "ends.log",
        &EndLine {
            pid: std::process::id(),
            verb,
            at: crate::util::monotonic_ns(),
        },
    );
}

/// One line of `crash.log`: a counted invocation under a staged crash that finished (`done`)
/// or parked (`parked`).
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct CrashLine {
    pub n: u64,
    pub verb: String,
    pub event: String,
    pub at: u64,
}

fn crash_log(store: &Store, n: u64, verb: &str, event: &str) {
    let _ = store.append_jsonl(
        "crash.log",
        &CrashLine {
            n,
            verb: verb.into(),
            event: event.into(),
            at: crate::util::monotonic_ns(),
        },
    );
}

/// Parks this invocation under a staged crash: it waits without answering until it is killed
/// (with the daemon that ran it) or the crash is cleared; then it kills itself, so nothing it
/// would have done after this point ever happens.
fn park(store: &Store, n: u64, verb: &str) -> ! {
    crash_log(store, n, verb, "parked");
    while Control::crash_staged(store) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    die()
}

/// Splits leading global flags from the argv and finds `group verb`.
fn command_path(argv: &[String]) -> Result<(String, String, Vec<String>), Fail> {
    let mut words = Vec::new();
    let mut rest = Vec::new();
    let mut i = 0;
    while i < argv.len() {
        let t = &argv[i];
        if words.len() < 2 && t.starts_with("--") {
            let name = t.trim_start_matches("--").split('=').next().unwrap_or("");
            if GLOBAL.iter().any(|(g, _, _)| *g == name) {
                rest.push(t.clone());
                if !t.contains('=') {
                    if let Some(v) = argv.get(i + 1) {
                        rest.push(v.clone());
                    }
                    i += 1;
                }
                i += 1;
                continue;
            }
        }
        if words.len() < 2 && !t.starts_with('-') {
            words.push(t.clone());
        } else {
            rest.push(t.clone());
        }
        i += 1;
    }
    // `cocoon version` is the one top-level verb without a group.
    if words.first().map(String::as_str) == Some("version") {
        return Ok(("version".into(), String::new(), rest));
    }
    if words.len() < 2 {
        return Err(Fail::new(format!(
            "unknown command {:?}: expected `vm|snapshot|image <verb>`",
            words.join(" ")
        )));
    }
    Ok((words[0].clone(), words[1].clone(), rest))
}

/// An injected `Fail` fault, the same for both simulated CLIs: its stdout is printed as the verb's
/// own output, its stderr becomes the failure's raw text and its code the exit code.
pub(crate) fn injected_failure(stdout: &str, stderr: String, exit_code: i32) -> std::io::Result<Fail> {
    std::io::stdout().write_all(stdout.as_bytes())?;
    Ok(Fail {
        msg: stderr,
        code: exit_code,
        raw: true,
    })
}

/// Entry point of the binary: returns the exit code.
pub fn run(argv: Vec<String>) -> i32 {
    exit_code(run_inner(argv))
}

/// How a verb's outcome leaves the process, the same for both simulated CLIs: a cobra-style
/// `Error: …` line (or the raw text a verb printed itself) on stderr and the failure's code.
pub(crate) fn exit_code(outcome: Result<(), Fail>) -> i32 {
    match outcome {
        Ok(()) => 0,
        Err(f) => {
            let _ = std::io::stdout().flush();
            if f.raw {
                if !f.msg.is_empty() {
                    let mut e = std::io::stderr().lock();
                    let _ = e.write_all(f.msg.as_bytes());
                    if !f.msg.ends_with('\n') {
                        let _ = e.write_all(b"\n");
                    }
                }
            } else {
                eprintln!("Error: {}", f.msg);
            }
            f.code
        }
    }
}

fn run_inner(argv: Vec<String>) -> Res {
    let store = Store::from_env();
    store.ensure_dirs()?;
    let (group, verb, rest) = command_path(&argv)?;
    let verb_key = format!("{group} {verb}").trim_end().to_string();
    log_call(&store, &verb_key, &argv)?;
    let proc_file = store.path("procs").join(std::process::id().to_string());
    std::fs::write(&proc_file, &verb_key)?;
    let _cleanup = RemoveOnDrop(proc_file);

    let step = if verb_key == "vm status" {
        None
    } else {
        Control::crash_step(&store)?
    };
    if let Some(CrashStep::Park(n)) = step {
        park(&store, n, &verb_key);
    }
    let outcome = run_verb(store.clone(), &group, &verb, &verb_key, &argv, &rest);
    match step {
        Some(CrashStep::RunThenPark(n)) => park(&store, n, &verb_key),
        Some(CrashStep::Run(n)) => crash_log(&store, n, &verb_key, "done"),
        _ => {}
    }
    log_end(&store, &verb_key);
    outcome
}

fn run_verb(store: Store, group: &str, verb: &str, verb_key: &str, argv: &[String], rest: &[String]) -> Res {
    let mut die_after = None;
    match Control::take_fault(&store, verb_key, argv)? {
        Some(FaultAction::Fail {
            stdout,
            stderr,
            exit_code,
        }) => return Err(injected_failure(&stdout, stderr, exit_code)?),
        Some(FaultAction::Delay { ms }) => std::thread::sleep(std::time::Duration::from_millis(ms)),
        Some(FaultAction::Die { after_bytes }) => die_after = Some(after_bytes),
        None => {}
    }
    let control = Control::load(&store)?;
    let ctx = Ctx {
        store,
        control,
        die_after,
    };
    let handled_die = matches!(
        verb_key,
        "vm run" | "vm create" | "vm clone" | "snapshot export" | "snapshot import" | "snapshot save" | "image import"
    );
    if die_after.is_some() && !handled_die {
        die();
    }
    match group {
        "version" => version(&ctx.control.settings.version),
        "vm" => crate::vm::dispatch(&ctx, verb, rest),
        "snapshot" => crate::snapshot::dispatch(&ctx, verb, rest),
        "image" => crate::image::dispatch(&ctx, verb, rest),
        _ => Err(Fail::new(format!("unknown command \"{group}\" for \"cocoon\""))),
    }
}

/// `cocoon version`: cocoon's `version.String()` (version/version.go), the build metadata its
/// Makefile sets with ldflags (`VERSION` is `git describe --tags`).
fn version(version: &str) -> Res {
    let text = format!(
        "Version:        {version}\nGit hash:       {}\nBuilt:          {}\nGolang version: {}\nOS/Arch:        {}/{}\n",
        "4feeddc81b63fde93a9a4260672640e13adb8c5c",
        "2026-08-12T02:20:14",
        "go1.25.1",
        "linux",
        if cfg!(target_arch = "aarch64") {
            "arm64"
        } else {
            "amd64"
        },
    );
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.flush()?;
    Ok(())
}

struct RemoveOnDrop(std::path::PathBuf);
impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    const SPEC: FlagSpec = &[
        ("name", None, Kind::Value),
        ("force", None, Kind::Bool),
        ("env", Some('e'), Kind::Repeat),
        ("interactive", Some('i'), Kind::Bool),
    ];

    #[test]
    fn parses_flags_both_forms_and_dashdash() {
        let a = parse(
            &s(&[
                "--name=x", "ref", "--force", "-e", "A=1", "-eB=2", "-i", "--", "ls", "-l",
            ]),
            SPEC,
        )
        .unwrap();
        assert_eq!(a.get("name"), Some("x"));
        assert!(a.has("force") && a.has("interactive"));
        assert_eq!(a.all("env"), vec!["A=1", "B=2"]);
        assert_eq!(a.positionals, vec!["ref"]);
        assert_eq!(a.rest, vec!["ls", "-l"]);
    }

    #[test]
    fn unknown_flag_is_cobra_error() {
        let e = parse(&s(&["--cpu", "2"]), SPEC).unwrap_err();
        assert_eq!(e.msg, "unknown flag: --cpu");
    }

    #[test]
    fn command_path_skips_globals() {
        let (g, v, rest) = command_path(&s(&["--root-dir", "/x", "vm", "inspect", "abc"])).unwrap();
        assert_eq!((g.as_str(), v.as_str()), ("vm", "inspect"));
        assert_eq!(rest, s(&["--root-dir", "/x", "abc"]));
    }
}
