//! The "qemu" of a running simulated macOS VM: `cocoon-macos-sim __qemu <disk> <pidfile> <vnc fd>
//! <ssh fd> <guest ip> <name> <ports>`. Its listeners are bound by the launching invocation and
//! inherited (as the real CLI binds the VNC port before it reports the launch, so a port in use
//! fails the run); it serves them until its pid file no longer names it (`vm stop` / `vm rm`, or
//! the state directory removed by a finished test) or it is killed.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{FromRawFd, IntoRawFd, RawFd};
use std::path::Path;
use std::time::Duration;

/// What a launch needs.
pub struct Launch<'a> {
    pub name: &'a str,
    pub disk: &'a str,
    pub pidfile: &'a Path,
    pub vnc: Option<TcpListener>,
    pub ssh: Option<TcpListener>,
    pub guest_ip: &'a str,
    pub guest_ports: &'a [u16],
}

fn inheritable(l: TcpListener) -> RawFd {
    let fd = l.into_raw_fd();
    // SAFETY: fcntl on a descriptor this process owns; only the close-on-exec flag changes.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFD);
        libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
    }
    fd
}

/// Starts the process (its own session: it outlives this invocation, as `qemu -daemonize`
/// does) and returns its pid once its command line is its own.
pub fn start(l: Launch<'_>) -> std::io::Result<i64> {
    use std::os::unix::process::CommandExt;
    let vnc_fd = l.vnc.map(inheritable).unwrap_or(-1);
    let ssh_fd = l.ssh.map(inheritable).unwrap_or(-1);
    let ports = if l.guest_ports.is_empty() {
        "-".to_string()
    } else {
        l.guest_ports.iter().map(u16::to_string).collect::<Vec<_>>().join(",")
    };
    let exe = std::env::current_exe()?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args([
        "__qemu",
        l.disk,
        &l.pidfile.display().to_string(),
        &vnc_fd.to_string(),
        &ssh_fd.to_string(),
        l.guest_ip,
        l.name,
        &ports,
    ])
    .stdin(std::process::Stdio::null())
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null());
    // SAFETY: setsid is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let child = cmd.spawn();
    for fd in [vnc_fd, ssh_fd] {
        if fd >= 0 {
            // SAFETY: the parent's copies of descriptors handed to the child.
            unsafe {
                libc::close(fd);
            }
        }
    }
    let child = child?;
    let pid = i64::from(child.id());
    std::mem::forget(child);
    std::fs::write(l.pidfile, pid.to_string())?;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !super::record::running(pid, l.disk) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(pid)
}

/// Stops the process (SIGKILL: there is no guest to shut down) if it is the VM's.
pub fn stop(pid: i64, disk: &str, pidfile: &Path) {
    if super::record::running(pid, disk) {
        // SAFETY: kill has no memory preconditions; the pid was checked to be this VM's.
        unsafe {
            libc::kill(pid as i32, libc::SIGKILL);
        }
    }
    let _ = std::fs::remove_file(pidfile);
}

fn serve(fd: RawFd, greeting: &'static [u8]) {
    if fd < 0 {
        return;
    }
    // SAFETY: the descriptor was inherited for exactly this listener.
    let listener = unsafe { TcpListener::from_raw_fd(fd) };
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || answer(conn, greeting));
        }
    });
}

/// Greets, then holds the connection until the client goes (a client reading the banner sees
/// it at once; nothing else is spoken).
fn answer(mut conn: TcpStream, greeting: &[u8]) {
    if conn.write_all(greeting).is_err() {
        return;
    }
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    let mut buf = [0u8; 256];
    while matches!(conn.read(&mut buf), Ok(n) if n > 0) {}
}

/// The body of the process.
pub fn main(args: &[String]) -> i32 {
    let [disk, pidfile, vnc, ssh, ip, name, ports] = args else {
        eprintln!("usage: cocoon-macos-sim __qemu DISK PIDFILE VNC_FD SSH_FD GUEST_IP NAME PORTS");
        return 2;
    };
    let _ = disk;
    serve(vnc.parse().unwrap_or(-1), b"RFB 003.008\n");
    serve(ssh.parse().unwrap_or(-1), b"SSH-2.0-OpenSSH_9.6 cocoon-macos-sim\r\n");
    for port in ports.split(',').filter_map(|p| p.parse::<u16>().ok()) {
        if let Err(e) = crate::vmm::guest_http::serve(ip, port, name) {
            eprintln!("guest port {ip}:{port}: {e}");
        }
    }
    let me = std::process::id().to_string();
    let pidfile = Path::new(pidfile);
    loop {
        std::thread::sleep(Duration::from_millis(100));
        match std::fs::read_to_string(pidfile) {
            Ok(s) if s.trim() == me => {}
            _ => return 0,
        }
    }
}
