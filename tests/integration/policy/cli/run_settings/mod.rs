//! `vk-cocoon run`'s settings, through the binary: `--help` lists every variable the daemon
//! reads with its default (the spec's defaults, and `deploy/vk-cocoon.env.example` documents
//! the same set), a value that does not parse stops the start naming the variable and what it
//! accepts, and an empty variable counts as unset.

use std::collections::BTreeSet;
use std::process::{Command, Output};

/// `vk-cocoon ARGS` with only `vars` in its environment (and PATH).
fn run_with(args: &[&str], vars: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vk-cocoon"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(vars.iter().copied())
        .output()
        .expect("run vk-cocoon")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The help with every run of whitespace made one space (clap wraps long lines).
fn help() -> String {
    let out = run_with(&["run", "--help"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout).split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The variables `[env: NAME=…]` of the help.
fn help_variables(help: &str) -> BTreeSet<String> {
    help.split("[env: ")
        .skip(1)
        // `[env: NAME=value]`, or `[env: NAME]` for a secret whose value help hides.
        .map(|rest| rest.split(['=', ']']).next().unwrap().to_string())
        .collect()
}

/// The variables of `deploy/vk-cocoon.env.example` (every `NAME=` line, commented or not) but
/// those a library reads itself (KUBECONFIG: kube's client; DOCKER_CONFIG: the docker
/// credential helper): `(all, not marked [todo])`.
fn documented_variables() -> (BTreeSet<String>, BTreeSet<String>) {
    let example =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/vk-cocoon.env.example")).unwrap();
    let mut all = BTreeSet::new();
    let mut honoured = BTreeSet::new();
    for line in example.lines() {
        let Some((name, _)) = line.trim_start_matches(['#', ' ']).split_once('=') else {
            continue;
        };
        let is_name = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
        if !is_name || name == "KUBECONFIG" || name == "DOCKER_CONFIG" {
            continue;
        }
        all.insert(name.to_string());
        if !line.contains("[todo]") {
            honoured.insert(name.to_string());
        }
    }
    (all, honoured)
}

#[test]
fn help_lists_every_variable_with_the_spec_defaults() {
    let help = help();
    let listed = help_variables(&help);
    let (documented, honoured) = documented_variables();
    assert!(listed.len() >= 60, "{} variables listed: {listed:?}", listed.len());
    assert_eq!(
        listed.difference(&documented).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "read by the daemon but not in deploy/vk-cocoon.env.example"
    );
    assert_eq!(
        honoured.difference(&listed).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "documented in deploy/vk-cocoon.env.example but not a setting of `vk-cocoon run`"
    );
    // The Go daemon's defaults (and the project's decisions: mmap, destroy, the 32 MiB budgets).
    for (var, default) in [
        ("VK_NODE_NAME", "cocoon-pool"),
        ("VK_LOG_LEVEL", "info"),
        ("VK_LOG_FORMAT", "text"),
        ("VK_LEASES_PATH", "/var/lib/cocoon/net/leases.json"),
        ("VK_COCOON_NET_CONTROL_SOCKET", "/run/cocoon-net/control.sock"),
        ("VK_COCOON_BIN", "/usr/local/bin/cocoon"),
        ("VK_ORPHAN_POLICY", "destroy"),
        ("VK_RESTORE_MODE", "mmap"),
        ("VK_PEER_ADDR", ":12501"),
        ("VK_NODE_POOL", "default"),
        ("VK_KUBELET_PORT", "10250"),
        // Loopback, not the spec's every interface: /metrics is unauthenticated.
        ("VK_METRICS_ADDR", "127.0.0.1:9091"),
        ("VK_RESERVE_PERCENT", "20"),
        ("COCOON_CGROUP_PARENT", "cocoon.slice"),
        ("VK_NODE_PODS", "256"),
        ("COCOON_ROOT_DIR", "/var/lib/cocoon"),
        ("COCOON_LOG_DIR", "/var/log/cocoon"),
        ("SNAPSHOT_ZSTD_LEVEL", "0"),
        ("SNAPSHOT_CHUNK_SIZE_MIB", "0"),
        ("SNAPSHOT_TRANSFER_CONCURRENCY", "0"),
        ("SNAPSHOT_MEMORY_BUDGET_MIB", "0"),
        ("SNAPSHOT_PULL_BUDGET_MIB", "0"),
        ("VK_TLS_CERT_DIR", "/var/lib/vk-cocoon/pki"),
        ("VK_STREAMING_WEBSOCKETS", "true"),
        ("VK_STREAMING_IDLE_TIMEOUT", "4h"),
        ("VK_STREAMING_CREATION_TIMEOUT", "30s"),
        ("VK_STREAMING_MAX_SESSIONS", "64"),
        ("VK_STREAMING_MAX_PORTFORWARD_STREAMS", "256"),
        ("VK_SNAPSHOT_RECLAIM_INTERVAL", "10m"),
        ("VK_MAX_CONCURRENT_BRING_UPS", "16"),
        ("VK_DECISION_LOG", "off"),
        ("VK_DECISION_LOG_MAX_BYTES", "67108864"),
        // Under the 30 s before SIGKILL of systemd's TimeoutStopSec and Kubernetes' grace period.
        ("VK_SHUTDOWN_DEADLINE", "25s"),
    ] {
        let entry = format!("[env: {var}=] [default: {default}]");
        assert!(help.contains(&entry), "{entry} is not in the help:\n{help}");
    }
}

#[test]
fn a_bad_value_stops_the_start_naming_the_variable_and_what_it_accepts() {
    for (var, value, accepted) in [
        ("VK_RESERVE_PERCENT", "101", "an integer from 0 to 100"),
        ("VK_KUBELET_PORT", "0", "an integer from 1 to 65535"),
        ("VK_RESTORE_MODE", "lazy", "copy, ondemand or mmap"),
        ("VK_MAX_CONCURRENT_BRING_UPS", "0", "a number of at least 1"),
        ("VK_COCOON_SUDO", "maybe", "true or false"),
        ("VK_NODE_IP", "10.0.0", "an IPv4 or IPv6 address"),
        ("VK_STREAMING_IDLE_TIMEOUT", "0s", "a duration such as 4h"),
        ("VK_PROBE_NETWORKS", "lan", "CIDRs such as 10.88.0.0/16"),
        ("COCOON_ROOT_DIR", "relative/dir", "an absolute directory path"),
        ("VK_POLICY_TIMEOUT_MS", "soon", "between 1 and 60000"),
        ("VK_SHUTDOWN_DEADLINE", "1s", "more than 1s"),
    ] {
        let out = run_with(&["run"], &[(var, value)]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{var}={value}: {stderr}");
        assert!(
            stderr.contains(&format!("{var}={value:?}")) && stderr.contains(accepted),
            "{var}={value}: {stderr}"
        );
        assert!(out.stdout.is_empty(), "nothing ran: {}", text(&out.stdout));
    }
    // Two settings that only make sense together: named by the daemon before it contacts anything.
    let out = run_with(&["run"], &[("VK_TLS_CERT", "/etc/vk/tls.crt")]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("VK_TLS_KEY") && stderr.contains("VK_TLS_CERT is set without it"),
        "{stderr}"
    );
}

#[test]
fn an_empty_variable_counts_as_unset() {
    // Blank values pass the parsers (each takes its default); the start then stops at the
    // cross-setting check, which shows that parsing went through.
    let out = run_with(
        &["run"],
        &[
            ("VK_RESERVE_PERCENT", ""),
            ("VK_KUBELET_PORT", "  "),
            ("VK_RESTORE_MODE", ""),
            ("VK_TLS_KEY", "/etc/vk/tls.key"),
        ],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("VK_TLS_CERT") && stderr.contains("VK_TLS_KEY is set without it"),
        "{stderr}"
    );
    assert!(!stderr.contains("VK_RESERVE_PERCENT"), "{stderr}");
}
