//! `vm …` verbs: the flags of each, the dispatch, references; `create` (run, create, clone and the
//! boot), `lifecycle` (inspect, list, rm, start, stop, reconcile-stale-create), `guest` (net, exec, logs).

use crate::cli::{Ctx, Fail, FlagSpec, Kind, Res, log, parse, print_json};
use crate::control::Control;
use crate::model::{Nic, NicNetwork, StorageConfig, Vm, VmConfig, VmEntry};
use crate::store::{Resolved, State, resolve};
use crate::util::{now_rfc3339, ram_in_bytes, seed_of};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};

use Kind::*;

mod create;
mod guest;
mod lifecycle;

pub use create::boot;
use create::*;
use guest::*;
pub use lifecycle::mark_stopped;
use lifecycle::*;

const RUN: FlagSpec = &[
    ("name", None, Value),
    ("cpu", None, Value),
    ("memory", None, Value),
    ("storage", None, Value),
    ("nics", None, Value),
    ("network", None, Value),
    ("bridge", None, Value),
    ("fc", None, Bool),
    ("windows", None, Bool),
    ("no-direct-io", None, Bool),
    ("queue-size", None, Value),
    ("disk-queue-size", None, Value),
    ("user", None, Value),
    ("password", None, Value),
    ("data-disk", None, Repeat),
    ("cpu-weight", None, Value),
    ("cpu-quota-us", None, Value),
    ("cpu-period-us", None, Value),
    ("cpu-burst-us", None, Value),
    ("cpuset-cpus", None, Value),
    ("shared-memory", None, Bool),
    ("hugepages", None, Bool),
    ("mergeable", None, Bool),
    ("no-watchdog", None, Bool),
    ("output", Some('o'), Value),
];
const CLONE: FlagSpec = &[
    ("name", None, Value),
    ("nics", None, Value),
    ("network", None, Value),
    ("bridge", None, Value),
    ("no-direct-io", None, Bool),
    ("queue-size", None, Value),
    ("disk-queue-size", None, Value),
    ("pull", None, Bool),
    ("restore-mode", None, Value),
    ("data-disk", None, Repeat),
    ("cpu-weight", None, Value),
    ("cpu-quota-us", None, Value),
    ("cpu-period-us", None, Value),
    ("cpu-burst-us", None, Value),
    ("cpuset-cpus", None, Value),
    ("from-dir", None, Value),
    ("output", Some('o'), Value),
];
const NONE: FlagSpec = &[];
const LIST: FlagSpec = &[("format", Some('o'), Value)];
const RM: FlagSpec = &[("force", None, Bool), ("output", Some('o'), Value)];
const START: FlagSpec = &[("output", Some('o'), Value)];
const STOP: FlagSpec = &[
    ("force", None, Bool),
    ("timeout", None, Value),
    ("output", Some('o'), Value),
];
const NET: FlagSpec = &[("nics", None, Value), ("output", Some('o'), Value)];
const EXEC: FlagSpec = &[("interactive", Some('i'), Bool), ("env", Some('e'), Repeat)];
const LOGS: FlagSpec = &[("tail", None, Value), ("follow", Some('f'), Bool)];
const STATUS: FlagSpec = &[
    ("event", None, Bool),
    ("watch", Some('w'), Bool),
    ("format", None, Value),
    ("interval", Some('n'), Value),
];

/// What a cocoon older than v0.5.8 lacks (the simulator's model of an old build: the verbs and
/// flags vk-cocoon sends arrived by then). Such a build answers them as cobra does.
const NEWER_VERBS: &[&str] = &["reconcile-stale-create", "exec", "net"];
const NEWER_FLAGS: &[&str] = &[
    "restore-mode",
    "from-dir",
    "cpu-weight",
    "cpu-quota-us",
    "cpu-period-us",
];

/// Whether `version` (`v0.5.7`, `v0.5.7-3-gabc`) is a release before v0.5.8; `unknown` is not.
fn predates_floor(version: &str) -> bool {
    let base = version
        .trim()
        .trim_start_matches('v')
        .split(['-', '+'])
        .next()
        .unwrap_or("");
    let parts: Vec<u64> = base.split('.').map_while(|p| p.parse().ok()).collect();
    matches!(parts.as_slice(), [major, minor, patch] if (*major, *minor, *patch) < (0, 5, 8))
}

pub fn dispatch(ctx: &Ctx, verb: &str, rest: &[String]) -> Res {
    if predates_floor(&ctx.control.settings.version) {
        if NEWER_VERBS.contains(&verb) {
            return Err(Fail::new(format!("unknown command \"{verb}\" for \"cocoon vm\"")));
        }
        if let Some(flag) = rest.iter().find_map(|t| {
            let name = t.strip_prefix("--")?.split('=').next()?;
            NEWER_FLAGS.contains(&name).then_some(name)
        }) {
            return Err(Fail::new(format!("unknown flag: --{flag}")));
        }
    }
    match verb {
        "run" | "create" => run(ctx, verb, &parse(rest, RUN)?),
        "clone" => clone(ctx, &parse(rest, CLONE)?),
        "inspect" => inspect(ctx, &parse(rest, NONE)?),
        "list" | "ls" => list(ctx, &parse(rest, LIST)?),
        "rm" => rm(ctx, &parse(rest, RM)?),
        "start" => start(ctx, &parse(rest, START)?),
        "stop" => stop(ctx, &parse(rest, STOP)?),
        "reconcile-stale-create" => reconcile_stale_create(ctx, &parse(rest, START)?),
        "net" => net(ctx, &parse(rest, NET)?),
        "exec" => exec(ctx, &parse(rest, EXEC)?),
        "logs" => logs(ctx, &parse(rest, LOGS)?),
        "status" => {
            let a = parse(rest, STATUS)?;
            if a.has("event") && a.has("watch") {
                return Err(Fail::new("--watch and --event are mutually exclusive"));
            }
            if a.has("event") {
                crate::events::run(ctx, &a.positionals)
            } else {
                list_out(ctx, a.get("format") == Some("json"))
            }
        }
        other => Err(Fail::new(format!("unknown command \"{other}\" for \"cocoon vm\""))),
    }
}

pub fn resolve_vm(state: &State, reference: &str) -> Result<String, Fail> {
    match resolve(
        reference,
        state.vms.iter().map(|(id, e)| (id, e.vm.config.name.as_str())),
    ) {
        Resolved::Found(id) => Ok(id),
        Resolved::NotFound => Err(Fail::new(format!("vm {reference}: VM not found"))),
        Resolved::Ambiguous => Err(Fail::new(format!("ambiguous ref \"{reference}\": multiple matches"))),
    }
}

pub fn sorted_vms(state: &State) -> Vec<&VmEntry> {
    let mut v: Vec<&VmEntry> = state.vms.values().collect();
    v.sort_by(|a, b| (a.vm.created_at.as_str(), a.seq).cmp(&(b.vm.created_at.as_str(), b.seq)));
    v
}

fn one_positional(a: &crate::cli::Args) -> Result<&str, Fail> {
    if a.positionals.len() != 1 {
        return Err(Fail::new(format!("accepts 1 arg(s), received {}", a.positionals.len())));
    }
    Ok(&a.positionals[0])
}

#[derive(Default, Clone, Copy)]
struct CpuPolicy {
    weight: i64,
    quota: i64,
    period: i64,
}

fn cpu_policy(a: &crate::cli::Args) -> Result<CpuPolicy, Fail> {
    let weight = a.int("cpu-weight")?.unwrap_or(0);
    let quota = a.int("cpu-quota-us")?.unwrap_or(0);
    let period = a.int("cpu-period-us")?.unwrap_or(0);
    if weight != 0 && !(1..=10000).contains(&weight) {
        return Err(Fail::new(format!("--cpu-weight must be 1..10000, got {weight}")));
    }
    if period != 0 && !(1000..=1_000_000).contains(&period) {
        return Err(Fail::new(format!(
            "--cpu-period-us must be 1000..1000000, got {period}"
        )));
    }
    if quota != 0 && quota < 1000 {
        return Err(Fail::new(format!("--cpu-quota-us must be at least 1000, got {quota}")));
    }
    Ok(CpuPolicy { weight, quota, period })
}

fn size_flag(a: &crate::cli::Args, name: &str, default: u64, min: u64, min_text: &str) -> Result<u64, Fail> {
    let v = match a.get(name) {
        None => default,
        Some(s) => ram_in_bytes(s).ok_or_else(|| Fail::new(format!("invalid --{name} {s:?}: invalid size")))?,
    };
    if v < min {
        return Err(Fail::new(format!("--{name} must be at least {min_text}, got {v}")));
    }
    Ok(v)
}

fn make_nics(state: &mut State, id: &str, count: i64, network: &str, mac_seed: u64, subnet: &str) -> Vec<Nic> {
    (0..count.max(0))
        .map(|i| {
            let m = mac_seed.wrapping_add(i as u64).to_be_bytes();
            let net = if network.contains("dhcp") {
                None
            } else {
                state.next_ip += 1;
                let n = state.next_ip + 1;
                Some(NicNetwork {
                    ip: format!("{subnet}.{}.{}", n / 250, n % 250 + 2),
                    gateway: format!("{subnet}.0.1"),
                    prefix: 16,
                })
            };
            Nic {
                tap: format!("tap{}-{i}", &id[..8]),
                mac: format!("02:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", m[3], m[4], m[5], m[6], m[7]),
                num_queues: 2,
                queue_size: 512,
                backend: "cni".into(),
                netns_path: format!("/var/run/netns/cocoon-{id}"),
                network: net,
            }
        })
        .collect()
}
