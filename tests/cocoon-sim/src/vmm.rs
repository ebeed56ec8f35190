//! The "hypervisor" of a running VM: a real process per running VM (so its pid, `/proc/<pid>`
//! and RSS are real), plus the files cocoon and the kernel keep for it: the run
//! directory with the COW disk and pid file, the hypervisor log `cocoon vm logs` reads, and a
//! cgroup-like `vm-<id>.scope/cpu.stat`. As root, the process also gets its own network
//! namespace with the VM's TAP device and sends `settings.vm_net_tx_bytes` of frames on it, so
//! `/proc/<pid>/net/dev` counts real traffic.
//!
//! A cloud-hypervisor VMM also serves the VM's serial console on `<run dir>/console.sock`
//! ([`console`]), and a VM with a static IP serves `settings.guest_http_ports` on it
//! ([`guest_http`]), so port-forward has a guest to reach (on loopback by default).
//!
//! The process is `cocoon-sim __vmm <sim root> <vm id> <rss bytes> <tap> <tx bytes> <name> <ip>
//! <ports>`; it exits when its marker `<sim root>/vmm/<id>.pid` no longer names it (the VM was
//! stopped or removed, or the simulator root was deleted by a finished test).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Where a VM's files are (decided once, at its boot, from the environment cocoon reads).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct VmFiles {
    pub run_dir: PathBuf,
    pub log_file: PathBuf,
    pub scope_dir: PathBuf,
    /// Wall-clock start of the current VMM, nanoseconds since the epoch.
    #[serde(default)]
    pub started_ns: u128,
}

/// The directory layout: cocoon's `COCOON_ROOT_DIR` / `COCOON_RUN_DIR` / `COCOON_LOG_DIR` and
/// `COCOON_CGROUP_PARENT`, with simulator-local defaults (never the host's real directories);
/// `COCOON_SIM_CGROUP_ROOT` stands in for `/sys/fs/cgroup`.
#[derive(Debug, Clone)]
pub struct Layout {
    pub run_dir: PathBuf,
    pub log_dir: PathBuf,
    pub cgroup_root: PathBuf,
    pub cgroup_parent: String,
}

fn env_path(k: &str) -> Option<PathBuf> {
    std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from)
}

impl Layout {
    pub fn from_env(sim_root: &Path) -> Self {
        let root = env_path("COCOON_ROOT_DIR").unwrap_or_else(|| sim_root.join("root"));
        Self {
            run_dir: env_path("COCOON_RUN_DIR").unwrap_or_else(|| root.join("run")),
            log_dir: env_path("COCOON_LOG_DIR").unwrap_or_else(|| sim_root.join("log")),
            cgroup_root: env_path("COCOON_SIM_CGROUP_ROOT").unwrap_or_else(|| sim_root.join("cgroup")),
            cgroup_parent: std::env::var("COCOON_CGROUP_PARENT")
                .ok()
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| "cocoon.slice".into()),
        }
    }

    pub fn files(&self, hypervisor: &str, id: &str) -> VmFiles {
        let (dir, log) = if hypervisor == "firecracker" {
            ("firecracker", "firecracker.log")
        } else {
            ("cloudhypervisor", "cloud-hypervisor.log")
        };
        VmFiles {
            run_dir: self.run_dir.join(dir).join(id),
            log_file: self.log_dir.join(dir).join(id).join(log),
            scope_dir: self
                .cgroup_root
                .join(&self.cgroup_parent)
                .join(format!("vm-{id}.scope")),
            started_ns: 0,
        }
    }
}

/// What a VMM needs to start.
pub struct Boot<'a> {
    pub sim_root: &'a Path,
    pub id: &'a str,
    pub name: &'a str,
    pub hypervisor: &'a str,
    pub cloudimg: bool,
    pub storage: u64,
    pub tap: &'a str,
    pub rss_bytes: u64,
    pub cow_data_bytes: u64,
    pub net_tx_bytes: u64,
    /// The static IP of NIC 0 (none for DHCP NICs).
    pub ip: Option<&'a str>,
    pub guest_ports: &'a [u16],
    /// A Windows guest: its console is the Special Administration Console, and its static
    /// address is only up once set there.
    pub windows: bool,
    /// How many NICs the guest has (the interfaces SAC lists).
    pub nics: usize,
    /// The guest's console never answers.
    pub console_silent: bool,
}

fn marker(sim_root: &Path, id: &str) -> PathBuf {
    sim_root.join("vmm").join(format!("{id}.pid"))
}

pub fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// A line of the hypervisor's log as the backend writes it: cloud-hypervisor prefixes the
/// time since the VMM started, firecracker the wall-clock time (UTC).
pub fn log_line(hypervisor: &str, name: &str, started_ns: u128, msg: &str) -> String {
    let now = now_ns();
    if hypervisor == "firecracker" {
        let secs = (now / 1_000_000_000) as i64;
        let nanos = (now % 1_000_000_000) as u32;
        let stamp = crate::util::format_rfc3339(secs, nanos);
        let naive = stamp
            .trim_end_matches('Z')
            .split('+')
            .next()
            .unwrap_or(&stamp)
            .to_string();
        format!("{naive} [{name}:main] {msg}")
    } else {
        let elapsed = Duration::from_nanos(now.saturating_sub(started_ns) as u64);
        format!("cloud-hypervisor: {elapsed:.6?}: <vmm> INFO:vmm/src/lib.rs:1 -- {msg}")
    }
}

pub fn append_log(files: &VmFiles, line: &str) -> std::io::Result<()> {
    if let Some(dir) = files.log_file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&files.log_file)?;
    writeln!(f, "{line}")
}

/// Writes the cgroup scope's `cpu.stat` (what the kernel's accounting would show).
pub fn write_cpu_stat(files: &VmFiles, usage_usec: u64, throttled_usec: u64, nr_throttled: u64) -> std::io::Result<()> {
    std::fs::create_dir_all(&files.scope_dir)?;
    let text = format!(
        "usage_usec {usage_usec}\nuser_usec {}\nsystem_usec {}\nnr_periods {nr_throttled}\nnr_throttled {nr_throttled}\nthrottled_usec {throttled_usec}\n",
        usage_usec / 2,
        usage_usec - usage_usec / 2
    );
    let tmp = files.scope_dir.join("cpu.stat.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(tmp, files.scope_dir.join("cpu.stat"))
}

fn write_cow(b: &Boot<'_>, run_dir: &Path) -> std::io::Result<()> {
    let (name, magic): (&str, &[u8]) = if b.cloudimg && b.hypervisor != "firecracker" {
        ("overlay.qcow2", b"QFI\xfb")
    } else {
        ("cow.raw", b"")
    };
    let path = run_dir.join(name);
    if path.exists() {
        return Ok(());
    }
    let f = std::fs::File::create(&path)?;
    f.set_len(b.storage.max(b.cow_data_bytes))?;
    let mut data = vec![0x5a_u8; b.cow_data_bytes as usize];
    let n = magic.len().min(data.len());
    data[..n].copy_from_slice(&magic[..n]);
    use std::os::unix::fs::FileExt;
    f.write_all_at(&data, 0)?;
    Ok(())
}

/// Starts the VMM of a VM and lays out its files; returns its pid and the files.
pub fn start(b: &Boot<'_>, layout: &Layout) -> std::io::Result<(i64, VmFiles)> {
    use std::os::unix::process::CommandExt;
    let mut files = layout.files(b.hypervisor, b.id);
    std::fs::create_dir_all(&files.run_dir)?;
    std::fs::create_dir_all(b.sim_root.join("vmm"))?;
    write_cow(b, &files.run_dir)?;
    let exe = std::env::current_exe()?;
    let child = std::process::Command::new(exe)
        .args([
            "__vmm",
            &b.sim_root.display().to_string(),
            b.id,
            &b.rss_bytes.to_string(),
            b.tap,
            &b.net_tx_bytes.to_string(),
            b.name,
            b.ip.unwrap_or("-"),
            &if b.guest_ports.is_empty() {
                "-".to_string()
            } else {
                b.guest_ports.iter().map(u16::to_string).collect::<Vec<_>>().join(",")
            },
            &match (b.windows && b.hypervisor != "firecracker", b.console_silent) {
                (true, false) => format!("sac:{}", b.nics),
                (true, true) => format!("silent:{}", b.nics),
                (false, _) => "getty".to_string(),
            },
        ])
        .current_dir(&files.run_dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        // Its own process group: a client killing the `vm run` invocation's group must not take
        // the VM with it (a real VMM is daemonized too).
        .process_group(0)
        .spawn()?;
    let pid = child.id();
    // Not waited for: the VMM outlives this invocation (its parent becomes init).
    std::mem::forget(child);
    // Until the child has exec'd, /proc shows this process's command line; callers judge
    // liveness by it, so return only once the VMM is itself, as cocoon returns only once its
    // VMM answers. On a loaded machine the exec can take seconds (with a 5 s bound that let the
    // run report success anyway, a busy test run once had its next `snapshot save` find the VM
    // not running, most likely this); a VMM that never comes up fails the run, as cocoon's does.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !alive(i64::from(pid), b.id) {
        if std::time::Instant::now() >= deadline {
            return Err(std::io::Error::other(format!(
                "the VMM of {} (pid {pid}) did not start within 60 s",
                b.id
            )));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    files.started_ns = now_ns();
    std::fs::write(marker(b.sim_root, b.id), pid.to_string())?;
    let pid_file = if b.hypervisor == "firecracker" {
        "fc.pid"
    } else {
        "ch.pid"
    };
    std::fs::write(files.run_dir.join(pid_file), pid.to_string())?;
    write_cpu_stat(&files, 0, 0, 0)?;
    for msg in [
        format!("{} VMM started (pid {pid})", b.hypervisor),
        format!("VM {} booted: running", b.name),
    ] {
        append_log(&files, &log_line(b.hypervisor, b.name, files.started_ns, &msg))?;
    }
    Ok((i64::from(pid), files))
}

/// Whether `pid` is this VM's live VMM (not a reused pid, not a zombie).
pub fn alive(pid: i64, id: &str) -> bool {
    if pid <= 0 {
        return false;
    }
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let ours = args.get(1) == Some(&&b"__vmm"[..]) && args.get(3) == Some(&id.as_bytes());
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, r)| r.trim_start().starts_with('Z')))
        .unwrap_or(true);
    ours && !zombie
}

/// Stops the VMM (SIGKILL: the simulator has no guest to shut down) and removes its cgroup
/// scope; `remove` also deletes the run and log directories (`vm rm`).
pub fn stop(sim_root: &Path, id: &str, pid: i64, files: Option<&VmFiles>, remove: bool) {
    if alive(pid, id) {
        // SAFETY: kill has no memory preconditions; the pid was checked to be this VM's VMM.
        unsafe {
            libc::kill(pid as i32, libc::SIGKILL);
        }
    }
    let _ = std::fs::remove_file(marker(sim_root, id));
    if let Some(f) = files {
        let _ = std::fs::remove_dir_all(&f.scope_dir);
        let _ = std::fs::remove_file(f.run_dir.join("ch.pid"));
        let _ = std::fs::remove_file(f.run_dir.join("fc.pid"));
        if remove {
            let _ = std::fs::remove_dir_all(&f.run_dir);
            if let Some(dir) = f.log_file.parent() {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }
}

/// The body of the VMM process.
pub fn main(args: &[String]) -> i32 {
    let [root, id, rss, tap, tx, name, ip, ports, console_kind] = args else {
        eprintln!("usage: cocoon-sim __vmm SIM_ROOT VM_ID RSS_BYTES TAP TX_BYTES NAME IP PORTS getty|sac:NICS");
        return 2;
    };
    let marker = marker(Path::new(root), id);
    let silent = console_kind.starts_with("silent:");
    let sac_nics = console_kind.split_once(':').and_then(|(_, n)| n.parse::<usize>().ok());
    // Sockets first: the TAP below moves this process into a network namespace of its own, and
    // the guest's services must stay reachable from the host's.
    let served = match sac_nics {
        Some(nics) => sac::serve(Path::new("console.sock"), nics, silent),
        None => console::serve(Path::new("console.sock"), name),
    };
    if let Err(e) = served {
        eprintln!("console.sock: {e}");
    }
    if ip != "-" {
        let ports: Vec<u16> = ports.split(',').filter_map(|p| p.parse::<u16>().ok()).collect();
        let serve = {
            let (ip, name) = (ip.clone(), name.clone());
            move || {
                for port in &ports {
                    if let Err(e) = guest_http::serve(&ip, *port, &name) {
                        eprintln!("guest port {ip}:{port}: {e}");
                    }
                }
            }
        };
        match sac_nics {
            // A Windows guest's static NIC has no address until it is set at the console.
            Some(_) => sac::when_set(ip.clone(), serve),
            None => serve(),
        }
    }
    let me = std::process::id().to_string();
    // Guest memory: touched, so it is resident.
    let rss: usize = rss.parse().unwrap_or(0);
    let mut memory = vec![0u8; rss];
    for i in (0..memory.len()).step_by(4096) {
        memory[i] = 1;
    }
    let _tap = net::tap_with_traffic(tap, tx.parse().unwrap_or(0));
    // The marker is written right after the spawn: give the writer a moment before the
    // first check counts its absence.
    let mut seen = false;
    for round in 0u64.. {
        std::hint::black_box(&memory);
        std::thread::sleep(Duration::from_millis(if seen { 1000 } else { 50 }));
        match std::fs::read_to_string(&marker) {
            Ok(v) if v == me => seen = true,
            Ok(_) => return 0,
            Err(_) if seen || round > 100 => return 0,
            Err(_) => {}
        }
    }
    0
}

mod console {
    //! The serial console as cloud-hypervisor's `--serial socket=` serves it: one client at a
    //! time (a new connection replaces the old one), bytes both ways, nothing replayed on
    //! connect. The "guest" behind it is a getty at a login prompt: what is typed is echoed, as
    //! a terminal does, and each line entered is answered with a fresh `NAME login: ` prompt.

    use std::io::{Read, Write};
    use std::os::unix::net::{UnixListener, UnixStream};
    use std::path::Path;
    use std::sync::{Arc, Mutex};

    pub fn serve(path: &Path, name: &str) -> std::io::Result<()> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)?;
        let name = name.to_string();
        let current: Arc<Mutex<Option<UnixStream>>> = Arc::default();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                if let Ok(mut held) = current.lock() {
                    if let Some(old) = held.take() {
                        let _ = old.shutdown(std::net::Shutdown::Both);
                    }
                    *held = conn.try_clone().ok();
                }
                let name = name.clone();
                std::thread::spawn(move || getty(conn, &name));
            }
        });
        Ok(())
    }

    fn getty(mut conn: UnixStream, name: &str) {
        let mut buf = [0u8; 4096];
        let mut last = 0u8;
        loop {
            let n = match conn.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let mut out = Vec::with_capacity(n + 64);
            for &b in &buf[..n] {
                match b {
                    b'\n' if last == b'\r' => {}
                    b'\r' | b'\n' => out.extend_from_slice(format!("\r\n{name} login: ").as_bytes()),
                    _ => out.push(b),
                }
                last = b;
            }
            if conn.write_all(&out).is_err() {
                return;
            }
        }
    }
}

mod sac {
    //! The serial console of a Windows guest: the Special Administration Console at its
    //! `SAC>` prompt (one client at a time, as cloud-hypervisor serves the socket). `i` lists the
    //! interfaces (`Net: <n>, Ip=...`, an IPv4 and an IPv6 line each), `i <n> <ip> <mask> <gw>`
    //! sets one's static IPv4 address; what is set persists in the run directory (`sac.json`), as
    //! Windows keeps it on its disk. A static address is unset (0.0.0.0) until set here.

    use std::io::{Read, Write};
    use std::os::unix::net::{UnixListener, UnixStream};
    use std::path::Path;
    use std::sync::{Arc, Mutex};

    use serde::{Deserialize, Serialize};

    const STATE: &str = "sac.json";

    #[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
    struct Net {
        net: u32,
        ip: String,
        mask: String,
        gateway: String,
    }

    fn load(nics: usize) -> Vec<Net> {
        std::fs::read(STATE)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_else(|| {
                // Windows numbers its interfaces with gaps.
                (0..nics)
                    .map(|k| Net {
                        net: 7 + 4 * k as u32,
                        ip: "0.0.0.0".into(),
                        mask: "0.0.0.0".into(),
                        gateway: "0.0.0.0".into(),
                    })
                    .collect()
            })
    }

    fn save(nets: &[Net]) {
        if let Ok(text) = serde_json::to_vec(nets) {
            let _ = std::fs::write("sac.json.tmp", text).and_then(|()| std::fs::rename("sac.json.tmp", STATE));
        }
    }

    pub fn serve(path: &Path, nics: usize, silent: bool) -> std::io::Result<()> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)?;
        let current: Arc<Mutex<Option<UnixStream>>> = Arc::default();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                if let Ok(mut held) = current.lock() {
                    if let Some(old) = held.take() {
                        let _ = old.shutdown(std::net::Shutdown::Both);
                    }
                    *held = conn.try_clone().ok();
                }
                if silent {
                    // A hung guest: the connection is held, nothing is ever answered.
                    std::mem::forget(conn);
                    continue;
                }
                std::thread::spawn(move || session(conn, nics));
            }
        });
        Ok(())
    }

    fn session(mut conn: UnixStream, nics: usize) {
        let mut buf = [0u8; 1024];
        let mut line = Vec::new();
        loop {
            let n = match conn.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            for &b in &buf[..n] {
                if b != b'\r' && b != b'\n' {
                    line.push(b);
                    continue;
                }
                if b == b'\n' && line.is_empty() {
                    continue;
                }
                let answer = command(&String::from_utf8_lossy(&line), nics);
                line.clear();
                if conn.write_all(format!("{answer}\r\nSAC>").as_bytes()).is_err() {
                    return;
                }
            }
        }
    }

    fn command(line: &str, nics: usize) -> String {
        let words: Vec<&str> = line.split_whitespace().collect();
        let mut nets = load(nics);
        match words.as_slice() {
            [] => String::new(),
            ["i"] => {
                let mut out = String::from("\r\nSAC is retrieving IP Addresses...\r\n");
                for n in &nets {
                    out.push_str(&format!(
                        "\r\nNet: {}, Ip={}  Subnet={}  Gateway={}\r\nNet: {}, Ip=fe80::{:x}",
                        n.net, n.ip, n.mask, n.gateway, n.net, n.net
                    ));
                }
                out
            }
            ["i", net, ip, mask, rest @ ..] if rest.len() <= 1 => {
                let Some(n) = net
                    .parse::<u32>()
                    .ok()
                    .and_then(|net| nets.iter_mut().find(|n| n.net == net))
                else {
                    return "\r\nThe specified network interface number is invalid.".into();
                };
                if ip.parse::<std::net::Ipv4Addr>().is_err() || mask.parse::<std::net::Ipv4Addr>().is_err() {
                    return "\r\nThe specified IP address is invalid.".into();
                }
                n.ip = ip.to_string();
                n.mask = mask.to_string();
                n.gateway = rest.first().map_or("0.0.0.0", |g| *g).to_string();
                save(&nets);
                "\r\nSAC successfully set the IP address, subnet mask, and gateway.".into()
            }
            _ => "\r\nUnrecognized command.  Try 'help' for more information.".into(),
        }
    }

    /// Runs `serve` once `ip` is set on an interface (checked every 100 ms, as the guest's
    /// network would come up when configured).
    pub fn when_set(ip: String, serve: impl FnOnce() + Send + 'static) {
        std::thread::spawn(move || {
            loop {
                let set = std::fs::read(STATE)
                    .ok()
                    .and_then(|b| serde_json::from_slice::<Vec<Net>>(&b).ok())
                    .is_some_and(|nets| nets.iter().any(|n| n.ip == ip));
                if set {
                    serve();
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        });
    }
}

pub(crate) mod guest_http {
    //! A guest's web server on its IP: `GET` answers `hello from NAME (IP:PORT): GET PATH`,
    //! `POST`/`PUT` echo the body; one request per connection.

    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::{TcpListener, TcpStream};

    pub fn serve(ip: &str, port: u16, name: &str) -> std::io::Result<()> {
        let listener = TcpListener::bind((ip, port))?;
        let who = format!("{name} ({ip}:{port})");
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let who = who.clone();
                std::thread::spawn(move || {
                    let _ = answer(conn, &who);
                });
            }
        });
        Ok(())
    }

    fn answer(conn: TcpStream, who: &str) -> std::io::Result<()> {
        let mut reader = BufReader::new(conn.try_clone()?);
        let mut request_line = String::new();
        reader.read_line(&mut request_line)?;
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 || line == "\r\n" || line == "\n" {
                break;
            }
            if let Some((k, v)) = line.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut parts = request_line.split_whitespace();
        let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or("/"));
        let body = if method == "POST" || method == "PUT" {
            let mut body = vec![0u8; length];
            reader.read_exact(&mut body)?;
            body
        } else {
            format!("hello from {who}: {method} {path}\n").into_bytes()
        };
        let mut conn = conn;
        write!(
            conn,
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )?;
        conn.write_all(&body)?;
        conn.flush()
    }
}

mod net {
    //! The VM's TAP in a network namespace of its own (root only; otherwise no TAP).

    use std::os::fd::{FromRawFd, OwnedFd};

    const TUNSETIFF: libc::c_ulong = 0x4004_54ca;

    pub fn tap_with_traffic(name: &str, tx_bytes: u64) -> Option<OwnedFd> {
        if name.is_empty() || name == "-" || name.len() >= libc::IFNAMSIZ {
            return None;
        }
        // SAFETY: plain syscalls on values owned here; every return code is checked.
        unsafe {
            if libc::geteuid() != 0 || libc::unshare(libc::CLONE_NEWNET) != 0 {
                return None;
            }
            let fd = libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
            if fd < 0 {
                return None;
            }
            let tap = OwnedFd::from_raw_fd(fd);
            let mut ifr: libc::ifreq = std::mem::zeroed();
            for (i, b) in name.bytes().enumerate() {
                ifr.ifr_name[i] = b as libc::c_char;
            }
            ifr.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short;
            if libc::ioctl(fd, TUNSETIFF as _, &mut ifr) != 0 {
                return None;
            }
            let sock = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
            if sock < 0 {
                return None;
            }
            let sock = OwnedFd::from_raw_fd(sock);
            ifr.ifr_ifru.ifru_flags = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            if libc::ioctl(
                std::os::fd::AsRawFd::as_raw_fd(&sock),
                libc::SIOCSIFFLAGS as _,
                &mut ifr,
            ) != 0
            {
                return None;
            }
            // Frames "from the guest": broadcast, a local experimental EtherType, 1000 bytes
            // each (the last one shorter), so the host side counts exactly `tx_bytes` received.
            let mut left = tx_bytes;
            while left > 0 {
                let len = left.clamp(60, 1000) as usize;
                let mut frame = vec![0u8; len];
                frame[..6].copy_from_slice(&[0xff; 6]);
                frame[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 1]);
                frame[12..14].copy_from_slice(&[0x88, 0xb5]);
                if libc::write(fd, frame.as_ptr().cast(), len) != len as isize {
                    break;
                }
                left = left.saturating_sub(len as u64);
            }
            Some(tap)
        }
    }
}
