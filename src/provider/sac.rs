//! Static addresses of a Windows guest, set through its serial console: the Special
//! Administration Console (SAC) Windows serves there, at a `SAC>` prompt. A Windows guest whose
//! NICs are static has no address to reach it over the network until one is set, so the host
//! types them at the console (`<COCOON_ROOT_DIR>/run/cloudhypervisor/<vm-id>/console.sock`):
//!
//! 1. connect, and press Enter until the `SAC>` prompt answers (the guest may still be booting);
//! 2. `i` lists the network interfaces (`Net: <n>, Ip=<ip> ...`, an IPv4 and an IPv6 line per
//!    interface), asked again until there are as many as the VM has NICs;
//! 3. for each address, `i <n> <ip> <mask> <gateway>`, the n of the NIC's place in that list;
//! 4. `i` again until each interface shows its address.
//!
//! The parsing is pure ([`nets`], [`has_ip`], [`dotted_mask`]); [`set_addresses`] talks to the
//! console.

use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use crate::kubelet::EventReason;
use crate::policy::contract::guest_fixup::ConsoleAddress;
use crate::registry::errors::Cause;
use crate::retry::Schedule;

const PROMPT: &str = "SAC>";

/// How patiently the console is worked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SacTimings {
    /// Between two tries of a step.
    pub interval: Duration,
    /// How long the console may take to answer with its prompt (the guest boots).
    pub dial_budget: Duration,
    /// Listings until every NIC shows.
    pub enum_tries: u32,
    /// Listings until the addresses show.
    pub verify_tries: u32,
    /// How long one command's answer may take.
    pub reply_timeout: Duration,
}

impl Default for SacTimings {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(2),
            dial_budget: Duration::from_secs(60),
            enum_tries: 60,
            verify_tries: 10,
            reply_timeout: Duration::from_secs(5),
        }
    }
}

/// Why one console command got no answer.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    /// The console's socket did not accept (the VM is not up yet, or has no console).
    #[error("{0}")]
    Connect(#[source] std::io::Error),
    #[error("writing to the console: {0}")]
    Write(#[source] std::io::Error),
    #[error(transparent)]
    Read(std::io::Error),
    #[error("the console closed")]
    Closed,
    /// SAC's listings are a few hundred bytes: this is no SAC.
    #[error("more than 1 MiB without a SAC> prompt")]
    NoPromptInMiB,
    #[error("no SAC> prompt within {0:?}")]
    NoPrompt(Duration),
}

/// Which step failed; each is its own Warning Event reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SacError {
    /// The last try's error (connecting, or the prompt's answer) is the source.
    #[error("the serial console {path} did not answer with SAC> within {budget:?}: {cause}")]
    Dial {
        path: String,
        budget: Duration,
        #[source]
        cause: Cause,
    },
    #[error("SAC listed {found} network interfaces after {tries} tries, the VM has {wanted}")]
    Enum { found: usize, wanted: usize, tries: u32 },
    /// `detail` says why in words; `cause` keeps the console's error when one failed.
    #[error("SAC did not take `{command}`: {detail}")]
    Set {
        command: String,
        detail: String,
        #[source]
        cause: Option<Cause>,
    },
    #[error("net {net} did not show {ip} after {tries} listings")]
    Verify { net: u32, ip: String, tries: u32 },
}

impl SacError {
    /// The Warning Event reason of the step.
    pub fn reason(&self) -> EventReason {
        match self {
            Self::Dial { .. } => EventReason::PostCloneSacDialFailed,
            Self::Enum { .. } => EventReason::PostCloneSacEnumFailed,
            Self::Set { .. } => EventReason::PostCloneSacSetFailed,
            Self::Verify { .. } => EventReason::PostCloneSacVerifyFailed,
        }
    }
}

/// The interfaces of an `i` listing, in order, each once (SAC prints an IPv4 and an IPv6 line
/// per interface): `Net: 7, Ip=10.88.0.60  Subnet=...`.
pub fn nets(listing: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for line in listing.lines() {
        if let Some((net, _)) = net_line(line)
            && !out.contains(&net)
        {
            out.push(net);
        }
    }
    out
}

/// `Net: <n>, Ip=<ip>` of one line.
fn net_line(line: &str) -> Option<(u32, &str)> {
    let rest = line.trim().strip_prefix("Net:")?;
    let (net, rest) = rest.split_once(',')?;
    let net = net.trim().parse().ok()?;
    let ip = rest.trim_start().strip_prefix("Ip=")?.split_whitespace().next()?;
    Some((net, ip))
}

/// The listing shows `ip` on interface `net`.
pub fn has_ip(listing: &str, net: u32, ip: &str) -> bool {
    listing
        .lines()
        .filter_map(net_line)
        .any(|(n, shown)| n == net && shown == ip)
}

/// The dotted mask of a prefix length; a prefix outside 1..=32 is a /24 (SAC needs a mask).
pub fn dotted_mask(prefix: u32) -> String {
    let prefix = if (1..=32).contains(&prefix) { prefix } else { 24 };
    let bits: u32 = if prefix == 32 { u32::MAX } else { !(u32::MAX >> prefix) };
    std::net::Ipv4Addr::from(bits).to_string()
}

/// A console session at the `SAC>` prompt.
struct Console {
    stream: UnixStream,
    reply_timeout: Duration,
}

impl Console {
    /// Connects and presses Enter until the prompt answers, within the dial budget.
    async fn open(path: &Path, t: &SacTimings) -> Result<Self, SacError> {
        // A next try every `interval` while it still starts within the dial budget.
        Schedule::every(t.interval)
            .within(t.dial_budget)
            .retry(
                || async move {
                    let stream = UnixStream::connect(path).await.map_err(ConsoleError::Connect)?;
                    let mut console = Console {
                        stream,
                        reply_timeout: t.reply_timeout,
                    };
                    console.command("").await?;
                    Ok(console)
                },
                |_: &ConsoleError| true,
                |_, _| {},
            )
            .await
            .map_err(|last| SacError::Dial {
                path: path.display().to_string(),
                budget: t.dial_budget,
                cause: Cause::new(last),
            })
    }

    /// Types `line` and Enter; the answer up to the next prompt.
    async fn command(&mut self, line: &str) -> Result<String, ConsoleError> {
        self.stream
            .write_all(format!("{line}\r\n").as_bytes())
            .await
            .map_err(ConsoleError::Write)?;
        let mut answer = Vec::new();
        let mut buf = [0u8; 4096];
        let read = async {
            loop {
                let n = self.stream.read(&mut buf).await.map_err(ConsoleError::Read)?;
                if n == 0 {
                    return Err(ConsoleError::Closed);
                }
                answer.extend_from_slice(&buf[..n]);
                // A bounded answer: SAC's listings are a few hundred bytes.
                if answer.len() > 1 << 20 {
                    return Err(ConsoleError::NoPromptInMiB);
                }
                if String::from_utf8_lossy(&answer).contains(PROMPT) {
                    return Ok(());
                }
            }
        };
        match tokio::time::timeout(self.reply_timeout, read).await {
            Ok(Ok(())) => Ok(String::from_utf8_lossy(&answer).into_owned()),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(ConsoleError::NoPrompt(self.reply_timeout)),
        }
    }
}

/// Sets `addresses` on a VM of `nics` NICs through its console at `path`.
pub async fn set_addresses(
    path: &Path,
    nics: usize,
    addresses: &[ConsoleAddress],
    t: &SacTimings,
) -> Result<(), SacError> {
    let mut console = Console::open(path, t).await?;
    let mut listed = Vec::new();
    let mut tries = Schedule::every(t.interval).tries(t.enum_tries as usize).delays();
    loop {
        if let Ok(listing) = console.command("i").await {
            listed = nets(&listing);
            if listed.len() >= nics {
                break;
            }
        }
        if !tries.wait().await {
            break;
        }
    }
    if listed.len() < nics {
        return Err(SacError::Enum {
            found: listed.len(),
            wanted: nics,
            tries: t.enum_tries,
        });
    }
    let mut set = Vec::new();
    for a in addresses {
        let net = *listed.get(a.nic as usize).ok_or_else(|| SacError::Set {
            command: format!("NIC {}", a.nic),
            detail: format!("the VM has {} NICs", listed.len()),
            cause: None,
        })?;
        let command = format!("i {net} {} {} {}", a.ip, dotted_mask(a.prefix), a.gateway);
        let command = command.trim_end().to_string();
        console.command(&command).await.map_err(|e| SacError::Set {
            command: command.clone(),
            detail: e.to_string(),
            cause: Some(Cause::new(e)),
        })?;
        set.push((net, a.ip.clone()));
    }
    for (net, ip) in set {
        let mut shown = false;
        let mut tries = Schedule::every(t.interval).tries(t.verify_tries as usize).delays();
        loop {
            if console.command("i").await.is_ok_and(|l| has_ip(&l, net, &ip)) {
                shown = true;
                break;
            }
            if !tries.wait().await {
                break;
            }
        }
        if !shown {
            return Err(SacError::Verify {
                net,
                ip,
                tries: t.verify_tries,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LISTING: &str = "SAC is retrieving IP Addresses...\r\n\r\nNet: 7, Ip=10.88.0.60  Subnet=255.255.255.0  Gateway=10.88.0.1\r\nNet: 7, Ip=fe80::2\r\nNet: 11, Ip=0.0.0.0  Subnet=0.0.0.0  Gateway=0.0.0.0\r\nNet: 11, Ip=fe80::3\r\n\r\nSAC>";

    #[test]
    fn a_listing_names_each_interface_once_in_order_with_its_addresses() {
        assert_eq!(nets(LISTING), [7, 11]);
        assert!(has_ip(LISTING, 7, "10.88.0.60"));
        assert!(has_ip(LISTING, 7, "fe80::2"));
        assert!(!has_ip(LISTING, 11, "10.88.0.60"));
        assert!(!has_ip(LISTING, 7, "10.88.0.6"), "the whole address, not a prefix");
        assert!(nets("SAC>").is_empty());
        assert!(nets("Net: x, Ip=1.2.3.4").is_empty());
    }

    /// A console that never answers: the Dial error reads as before (the last try's error after
    /// the budget) and keeps that error, down to the io error of the connect, as its source.
    #[tokio::test]
    async fn a_console_that_is_not_there_keeps_the_connect_error_as_the_source() {
        use std::error::Error as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("console.sock");
        let t = SacTimings {
            interval: Duration::from_millis(1),
            dial_budget: Duration::from_millis(5),
            ..SacTimings::default()
        };
        let e = set_addresses(&path, 1, &[], &t).await.unwrap_err();
        assert_eq!(e.reason(), EventReason::PostCloneSacDialFailed);
        let io = std::fs::metadata(&path).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "the serial console {} did not answer with SAC> within {:?}: {io}",
                path.display(),
                t.dial_budget
            )
        );
        let connect = e
            .source()
            .and_then(|s| s.source())
            .expect("the connect error under the cause");
        let connect = connect.downcast_ref::<std::io::Error>().expect("an io error");
        assert_eq!(connect.kind(), std::io::ErrorKind::NotFound);
    }

    #[test]
    fn masks_of_prefixes() {
        assert_eq!(dotted_mask(24), "255.255.255.0");
        assert_eq!(dotted_mask(16), "255.255.0.0");
        assert_eq!(dotted_mask(32), "255.255.255.255");
        assert_eq!(dotted_mask(1), "128.0.0.0");
        assert_eq!(dotted_mask(0), "255.255.255.0", "out of range is a /24");
        assert_eq!(dotted_mask(33), "255.255.255.0");
    }
}
