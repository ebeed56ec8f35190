//! What reaches the guest: `vm net` (NICs), `vm exec` (a real process as the guest's command),
//! `vm logs`.

use super::*;

pub(super) fn net(ctx: &Ctx, a: &crate::cli::Args) -> Res {
    let r = one_positional(a)?;
    let n = a
        .int("nics")?
        .ok_or_else(|| Fail::new("required flag(s) \"nics\" not set"))?;
    if n < 0 {
        return Err(Fail::new(format!("--nics must be >= 0, got {n}")));
    }
    let id = ctx.store.update(|s| -> Result<String, Fail> {
        let id = resolve_vm(s, r)?;
        if s.vms[&id].vm.hypervisor == "firecracker" {
            return Err(Fail::new(format!(
                "vm {id}: NIC resize is not supported by firecracker"
            )));
        }
        let (network, have) = (
            s.vms[&id].vm.config.network.clone(),
            s.vms[&id].vm.network_configs.len() as i64,
        );
        let extra = if n > have {
            make_nics(s, &id, n, &network, seed_of(&id), &ctx.control.settings.static_subnet).split_off(have as usize)
        } else {
            Vec::new()
        };
        let e = s.vms.get_mut(&id).expect("resolved");
        e.vm.network_configs.truncate(n as usize);
        e.vm.network_configs.extend(extra);
        e.vm.updated_at = now_rfc3339();
        Ok(id)
    })?;
    if a.get("output") == Some("json") {
        print_json(&Succeeded { succeeded: vec![id] })?;
    }
    Ok(())
}

pub(super) fn exec(ctx: &Ctx, a: &crate::cli::Args) -> Res {
    let r = a
        .positionals
        .first()
        .ok_or_else(|| Fail::new("exec: requires a VM argument"))?;
    let mut argv: Vec<String> = a.positionals[1..].to_vec();
    argv.extend(a.rest.iter().cloned());
    if argv.is_empty() {
        return Err(Fail::new("exec: no command given"));
    }
    let mut env = Vec::new();
    for kv in a.all("env") {
        if !kv.contains('=') || kv.starts_with('=') {
            return Err(Fail::new(format!("exec: --env {kv:?} must be KEY=VALUE")));
        }
        env.push(kv);
    }
    let (id, name, running) = ctx.store.read(|s| {
        resolve_vm(s, r).map(|id| {
            (
                id.clone(),
                s.vms[&id].vm.config.name.clone(),
                s.vms[&id].reconciled().state == "running",
            )
        })
    })??;
    if !running {
        return Err(Fail::new(format!("exec: vm {id}: VM not running")));
    }
    let rule = Control::take_exec(&ctx.store, &id, &name, &argv)?;
    if rule.as_ref().is_some_and(|r| r.run) {
        return run_for_real(ctx, id, name, argv, env, a.has("interactive"));
    }
    let mut stdin = Vec::new();
    if a.has("interactive") {
        std::io::stdin().read_to_end(&mut stdin)?;
    }
    let (code, out, err) = match &rule {
        Some(r) => (r.exit_code, r.stdout.as_bytes().to_vec(), r.stderr.clone()),
        None => (0, stdin.clone(), String::new()),
    };
    let record = crate::helper::ExecRecord {
        vm_id: id,
        vm_name: name,
        argv,
        env,
        interactive: a.has("interactive"),
        stdin: String::from_utf8_lossy(&stdin).into_owned(),
        exit_code: code,
        at: now_rfc3339(),
    };
    ctx.store.append_jsonl("exec.log", &record)?;
    std::io::stdout().write_all(&out)?;
    std::io::stdout().flush()?;
    eprint!("{err}");
    if code != 0 {
        return Err(Fail::silent(code));
    }
    Ok(())
}

/// The uid and gid of `nobody`, which guest commands run as when the simulator is root.
const NOBODY: u32 = 65534;

/// `vm exec` of an [`ExecRule::run`] rule: the argv as a real child with this process's stdio
/// (stdin only with `-i`), which the kernel kills if this process dies (PR_SET_PDEATHSIG).
pub(super) fn run_for_real(
    ctx: &Ctx,
    id: String,
    name: String,
    argv: Vec<String>,
    env: Vec<String>,
    interactive: bool,
) -> Res {
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    let parent = std::process::id() as i32;
    let mut cmd = std::process::Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .envs(env.iter().filter_map(|kv| kv.split_once('=')))
        .stdin(if interactive {
            std::process::Stdio::inherit()
        } else {
            std::process::Stdio::null()
        })
        .current_dir("/");
    // The simulated guest is this machine: a command meant for a guest (the daemon's post-clone
    // fixups write /etc/hostname and restart systemd-networkd) must not change the host. Run as
    // root, the simulator runs it as `nobody`, so such a command fails instead.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        cmd.uid(NOBODY).gid(NOBODY); // std drops the supplementary groups too
    }
    // SAFETY: prctl and getppid are async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 || libc::getppid() != parent {
                // The parent is already gone: so is the session this command was for.
                libc::_exit(137);
            }
            Ok(())
        });
    }
    let status = cmd
        .status()
        .map_err(|e| Fail::new(format!("exec: start {:?} in VM {id}: {e}", argv[0])))?;
    let code = status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    let record = crate::helper::ExecRecord {
        vm_id: id,
        vm_name: name,
        argv,
        env,
        interactive,
        stdin: String::new(),
        exit_code: code,
        at: now_rfc3339(),
    };
    ctx.store.append_jsonl("exec.log", &record)?;
    if code != 0 {
        return Err(Fail::silent(code));
    }
    Ok(())
}

pub(super) fn logs(ctx: &Ctx, a: &crate::cli::Args) -> Res {
    let r = one_positional(a)?;
    let (id, hypervisor, files) = ctx.store.read(|s| {
        resolve_vm(s, r).map(|id| {
            let e = &s.vms[&id];
            (id.clone(), e.vm.hypervisor.clone(), e.files.clone())
        })
    })??;
    let path = files.map(|f| f.log_file).unwrap_or_else(|| {
        crate::vmm::Layout::from_env(&ctx.store.root)
            .files(&hypervisor, &id)
            .log_file
    });
    let text = match std::fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Fail::new(format!(
                "open log {}: VM may not have been started yet",
                path.display()
            )));
        }
        Err(e) => return Err(Fail::new(format!("open log: {e}"))),
    };
    let tail = a.int("tail")?.filter(|t| *t > 0).map(|t| t as usize);
    let start = match tail {
        Some(n) => tail_start(&text, n),
        None => 0,
    };
    let mut out = std::io::stdout().lock();
    out.write_all(&text[start..])?;
    out.flush()?;
    if a.has("follow") {
        let mut offset = text.len();
        loop {
            std::thread::sleep(std::time::Duration::from_millis(100));
            let Ok(now) = std::fs::read(&path) else { return Ok(()) };
            if now.len() < offset {
                offset = 0;
            }
            out.write_all(&now[offset..])?;
            out.flush()?;
            offset = now.len();
        }
    }
    Ok(())
}

/// Where the last `n` lines start; a final `\n` does not count as a separator (cocoon's
/// `seekToLastNLines`).
pub(super) fn tail_start(text: &[u8], n: usize) -> usize {
    let end = if text.ends_with(b"\n") {
        text.len() - 1
    } else {
        text.len()
    };
    let mut found = 0;
    for i in (0..end).rev() {
        if text[i] == b'\n' {
            found += 1;
            if found == n {
                return i + 1;
            }
        }
    }
    0
}
