//! `snapshot …` verbs.

use crate::cli::{Ctx, Fail, FlagSpec, Kind, Res, die, log, parse, print_json};
use crate::model::{Empty, Envelope, SnapshotConfig, SnapshotEntry, SnapshotRecord};
use crate::store::{Resolved, State, resolve};
use crate::util::{fill_block, now_rfc3339, seed_of};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;

use Kind::*;

const SAVE: FlagSpec = &[("name", None, Value), ("description", None, Value)];
const LIST: FlagSpec = &[("format", Some('o'), Value), ("vm", None, Value)];
const NONE: FlagSpec = &[];
const EXPORT: FlagSpec = &[
    ("output", Some('o'), Value),
    ("gzip", None, Bool),
    ("to-dir", None, Value),
];
const IMPORT: FlagSpec = &[("name", None, Value), ("description", None, Value)];

pub fn dispatch(ctx: &Ctx, verb: &str, rest: &[String]) -> Res {
    match verb {
        "save" => save(ctx, &parse(rest, SAVE)?),
        "list" | "ls" => list(ctx, &parse(rest, LIST)?),
        "inspect" => inspect(ctx, &parse(rest, NONE)?),
        "rm" => rm(ctx, &parse(rest, NONE)?),
        "export" => export(ctx, &parse(rest, EXPORT)?),
        "import" => import(ctx, &parse(rest, IMPORT)?),
        other => Err(Fail::new(format!(
            "unknown command \"{other}\" for \"cocoon snapshot\""
        ))),
    }
}

fn valid_name(n: &str) -> bool {
    let b = n.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || b"._:/-".contains(c))
}

fn resolve_snap(s: &State, r: &str) -> Resolved {
    resolve(
        r,
        s.snapshots
            .iter()
            .filter(|(_, e)| !e.pending)
            .map(|(id, e)| (id, e.record.config.name.as_str())),
    )
}

fn name_holder(s: &State, name: &str) -> Option<String> {
    s.snapshots
        .iter()
        .find(|(_, e)| e.record.config.name == name)
        .map(|(id, _)| id.clone())
}

fn lease_path(ctx: &Ctx, id: &str) -> std::path::PathBuf {
    ctx.store.path("snapshots").join(format!("{id}.lease"))
}

/// A shared lease held while a snapshot is exported; `snapshot rm` refuses while one is held.
fn take_lease(ctx: &Ctx, id: &str) -> std::io::Result<File> {
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(lease_path(ctx, id))?;
    f.lock_shared()?;
    Ok(f)
}

/// A guest RAM file of `size` bytes: each 4 KiB page zero, text-like or pseudo-random, in the settings'
/// proportions (deterministic in `seed` and the page number, so a re-save writes the same bytes).
fn write_memory(path: &Path, size: u64, seed: u64, settings: &crate::control::Settings) -> std::io::Result<()> {
    let mix = PageMix {
        zero: settings.snapshot_memory_zero_pct.min(100) as u64,
        text: settings.snapshot_memory_text_pct.min(100) as u64,
    };
    let mut f = std::io::BufWriter::with_capacity(1 << 20, File::create(path)?);
    let mut buf = vec![0u8; 1 << 20];
    let mut done = 0u64;
    let mut block = 0u64;
    while done < size {
        let n = buf.len().min((size - done) as usize);
        if mix.zero == 0 && mix.text == 0 {
            fill_block(&mut buf[..n], seed, block);
        } else {
            for (i, page) in buf[..n].chunks_mut(PAGE).enumerate() {
                mix.fill(page, seed, (done / PAGE as u64) + i as u64);
            }
        }
        f.write_all(&buf[..n])?;
        done += n as u64;
        block += 1;
    }
    f.flush()
}

const PAGE: usize = 4096;

/// Percent of pages that are zero and text; the rest are random.
struct PageMix {
    zero: u64,
    text: u64,
}

impl PageMix {
    fn fill(&self, page: &mut [u8], seed: u64, n: u64) {
        // Which kind a page is: a hash of its number, so the kinds interleave as in a real guest.
        let roll = (seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0xBF58_476D_1CE4_E5B9) >> 33;
        let pick = roll % 100;
        if pick < self.zero {
            page.fill(0);
        } else if pick < self.zero + self.text {
            fill_text(page, seed ^ n);
        } else {
            fill_block(page, seed, n ^ 0xD1B5_4A32_D192_ED03);
        }
    }
}

/// Words from a small vocabulary, separated by spaces and the odd newline: about as compressible as
/// logs and configuration files in a page cache.
fn fill_text(page: &mut [u8], seed: u64) {
    const WORDS: &[&str] = &[
        "the",
        "kernel",
        "systemd",
        "started",
        "service",
        "network",
        "interface",
        "eth0",
        "link",
        "up",
        "error",
        "info",
        "debug",
        "config",
        "value",
        "true",
        "false",
        "user",
        "root",
        "path",
        "/usr/lib",
        "/var/log",
        "session",
        "opened",
        "closed",
        "request",
        "GET",
        "200",
        "connection",
        "timeout",
    ];
    let mut x = seed | 1;
    let mut i = 0;
    while i < page.len() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let w = WORDS[(x % WORDS.len() as u64) as usize].as_bytes();
        let sep: &[u8] = if x.is_multiple_of(11) { b"\n" } else { b" " };
        for &b in w.iter().chain(sep) {
            if i == page.len() {
                break;
            }
            page[i] = b;
            i += 1;
        }
    }
}

/// A sparse disk of apparent `size` holding `data` bytes of content in two extents (start and middle).
fn write_sparse(path: &Path, size: u64, data: u64, seed: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let f = File::create(path)?;
    f.set_len(size)?;
    let data = data.min(size);
    let first = data / 2;
    for (start, len) in [(0, first), (size / 2, data - first)] {
        let len = len.min(size - start);
        let mut buf = vec![0u8; len as usize];
        fill_block(&mut buf, seed, start);
        f.write_all_at(&buf, start)?;
    }
    Ok(())
}

fn save(ctx: &Ctx, a: &crate::cli::Args) -> Res {
    let r = a
        .positionals
        .first()
        .ok_or_else(|| Fail::new("accepts 1 arg(s), received 0"))?
        .clone();
    let settings = ctx.control.settings.clone();
    let id = crate::util::new_id();
    let dir = ctx.store.snapshot_dir(&id);
    let (config, vm_name) = ctx.store.update(|s| -> Result<(SnapshotConfig, String), Fail> {
        let vm_id = crate::vm::resolve_vm(s, &r)?;
        let e = &s.vms[&vm_id];
        if e.reconciled().state != "running" {
            return Err(Fail::new(format!("vm {vm_id}: VM not running")));
        }
        let name = a
            .get("name")
            .map(str::to_string)
            .unwrap_or_else(|| format!("snapshot-{}", &id[..8]));
        if !valid_name(&name) {
            return Err(Fail::new(format!("invalid snapshot name {name:?}")));
        }
        if let Some(holder) = name_holder(s, &name) {
            return Err(Fail::new(format!(
                "snapshot name \"{name}\" already in use by {holder}"
            )));
        }
        let vm = &e.vm;
        let digest = vm.config.image_digest.trim_start_matches("sha256:").to_string();
        let config = SnapshotConfig {
            cpu: vm.config.cpu,
            memory: vm.config.memory,
            storage: vm.config.storage,
            image: vm.config.image.clone(),
            image_digest: vm.config.image_digest.clone(),
            image_type: vm.config.image_type.clone(),
            network: vm.config.network.clone(),
            no_direct_io: vm.config.no_direct_io,
            windows: vm.config.windows,
            id: id.clone(),
            name,
            description: a.get("description").unwrap_or("").into(),
            image_blob_ids: if digest.is_empty() {
                Default::default()
            } else {
                [(digest, Empty {})].into()
            },
            hypervisor: vm.hypervisor.clone(),
            nics: vm.network_configs.len() as i64,
        };
        let seq = s.next_seq();
        s.snapshots.insert(
            id.clone(),
            SnapshotEntry {
                record: SnapshotRecord {
                    config: config.clone(),
                    created_at: now_rfc3339(),
                },
                pending: true,
                data_dir: dir.display().to_string(),
                seq,
            },
        );
        Ok((config, vm_id))
    })?;
    let written = (|| -> std::io::Result<()> {
        std::fs::create_dir_all(&dir)?;
        let seed = seed_of(&id);
        let fc = config.hypervisor == "firecracker";
        let cfg = serde_json::to_vec_pretty(&config).map_err(std::io::Error::other)?;
        if fc {
            std::fs::write(dir.join("vmstate"), &cfg)?;
            write_memory(&dir.join("mem"), settings.snapshot_memory_bytes, seed, &settings)?;
        } else {
            std::fs::write(dir.join("config.json"), &cfg)?;
            std::fs::write(
                dir.join("state.json"),
                format!("{{\"vm\":\"{vm_name}\",\"saved_at\":\"{}\"}}\n", now_rfc3339()),
            )?;
            write_memory(
                &dir.join("memory-ranges"),
                settings.snapshot_memory_bytes,
                seed,
                &settings,
            )?;
        }
        write_sparse(
            &dir.join("cow.raw"),
            settings.snapshot_cow_bytes,
            settings.snapshot_cow_data_bytes,
            seed ^ 0xC0,
        )?;
        std::fs::write(
            dir.join("cocoon.json"),
            b"{\"storage_configs\":[{\"path\":\"cow.raw\",\"ro\":false,\"serial\":\"cocoon-cow\",\"role\":\"cow\"}],\"boot_config\":{}}\n",
        )
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(&dir);
        let _ = ctx.store.update(|s| -> Result<(), Fail> {
            s.snapshots.remove(&id);
            Ok(())
        });
        return Err(Fail::new(format!("snapshot save: write data: {e}")));
    }
    ctx.die_here();
    ctx.store.update(|s| -> Result<(), Fail> {
        if let Some(e) = s.snapshots.get_mut(&id) {
            e.pending = false;
        }
        if let Some(vm) = s.vms.get_mut(&vm_name) {
            vm.vm.snapshot_ids.insert(id.clone(), Empty {});
        }
        Ok(())
    })?;
    log(&format!("snapshot saved: {id}"));
    Ok(())
}

fn sorted(s: &State) -> Vec<SnapshotRecord> {
    let mut v: Vec<&SnapshotEntry> = s.snapshots.values().filter(|e| !e.pending).collect();
    v.sort_by(|a, b| (a.record.created_at.as_str(), a.seq).cmp(&(b.record.created_at.as_str(), b.seq)));
    v.into_iter().map(|e| e.record.clone()).collect()
}

fn list(ctx: &Ctx, a: &crate::cli::Args) -> Res {
    let vm = a.get("vm").map(str::to_string);
    let snaps = ctx.store.read(|s| -> Result<Vec<SnapshotRecord>, Fail> {
        let all = sorted(s);
        Ok(match &vm {
            None => all,
            Some(r) => {
                let id = crate::vm::resolve_vm(s, r)?;
                let ids = &s.vms[&id].vm.snapshot_ids;
                all.into_iter().filter(|x| ids.contains_key(&x.config.id)).collect()
            }
        })
    })??;
    if snaps.is_empty() {
        println!(
            "{}",
            if vm.is_some() {
                "No snapshots found for VM."
            } else {
                "No snapshots found."
            }
        );
        return Ok(());
    }
    if a.get("format") == Some("json") {
        return print_json(&snaps);
    }
    println!("ID\tNAME\tIMAGE\tCREATED");
    for x in snaps {
        println!(
            "{}\t{}\t{}\t{}",
            x.config.id, x.config.name, x.config.image, x.created_at
        );
    }
    Ok(())
}

fn inspect(ctx: &Ctx, a: &crate::cli::Args) -> Res {
    let r = a
        .positionals
        .first()
        .ok_or_else(|| Fail::new("accepts 1 arg(s), received 0"))?;
    let rec = ctx.store.read(|s| match resolve_snap(s, r) {
        Resolved::Found(id) => Ok(s.snapshots[&id].record.clone()),
        Resolved::NotFound => Err(Fail::new("inspect: snapshot not found")),
        Resolved::Ambiguous => Err(Fail::new(format!("inspect: ambiguous ref \"{r}\": multiple matches"))),
    })??;
    print_json(&rec)
}

fn rm(ctx: &Ctx, a: &crate::cli::Args) -> Res {
    if a.positionals.is_empty() {
        return Err(Fail::new("requires at least 1 arg(s), only received 0"));
    }
    for r in &a.positionals {
        let id = ctx.store.update(|s| -> Result<String, Fail> {
            // cocoon's delete resolves pending records too: a save that died holds its name until
            // removed, and `rm` is how it is removed.
            let every = s.snapshots.iter().map(|(id, e)| (id, e.record.config.name.as_str()));
            let id = match resolve(r, every) {
                Resolved::Found(id) => id,
                Resolved::NotFound => return Err(Fail::new(format!("rm: resolve \"{r}\": snapshot not found"))),
                Resolved::Ambiguous => return Err(Fail::new(format!("rm: ambiguous ref \"{r}\": multiple matches"))),
            };
            let lease = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(lease_path(ctx, &id))?;
            if lease.try_lock().is_err() {
                return Err(Fail::new(format!("rm: snapshot {id} is in use by an active export")));
            }
            let entry = s.snapshots.remove(&id).expect("resolved");
            let _ = std::fs::remove_dir_all(&entry.data_dir);
            let _ = std::fs::remove_file(lease_path(ctx, &id));
            for vm in s.vms.values_mut() {
                vm.vm.snapshot_ids.remove(&id);
            }
            Ok(id)
        })?;
        log(&format!("deleted: {id}"));
    }
    Ok(())
}

/// Writer that SIGKILLs the process once `limit` bytes went through (the `die` fault).
struct DieAfter<W> {
    inner: W,
    left: Option<u64>,
}

impl<W: Write> Write for DieAfter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Some(left) = self.left {
            if left == 0 {
                die();
            }
            let n = buf.len().min(left as usize);
            let n = self.inner.write(&buf[..n])?;
            self.left = Some(left - n as u64);
            return Ok(n);
        }
        self.inner.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn export(ctx: &Ctx, a: &crate::cli::Args) -> Res {
    let r = a
        .positionals
        .first()
        .ok_or_else(|| Fail::new("accepts 1 arg(s), received 0"))?;
    let (entry, name) = ctx.store.read(|s| match resolve_snap(s, r) {
        Resolved::Found(id) => Ok((s.snapshots[&id].clone(), s.snapshots[&id].record.config.name.clone())),
        Resolved::NotFound => Err(Fail::new(format!("export: resolve \"{r}\": snapshot not found"))),
        Resolved::Ambiguous => Err(Fail::new(format!("export: ambiguous ref \"{r}\": multiple matches"))),
    })??;
    let _lease = take_lease(ctx, &entry.record.config.id)?;
    let envelope = Envelope {
        config: entry.record.config.clone(),
        version: 1,
    };
    let dir = Path::new(&entry.data_dir);
    if let Some(target) = a.get("to-dir") {
        if a.get("output").is_some() || a.has("gzip") {
            return Err(Fail::new("--to-dir cannot be combined with -o or --gzip"));
        }
        let target = Path::new(target);
        if target.exists() && std::fs::read_dir(target)?.next().is_some() {
            return Err(Fail::new(format!("target dir {} is not empty", target.display())));
        }
        ctx.die_here();
        crate::tarfmt::export_to_dir(&envelope, dir, target).map_err(|e| Fail::new(format!("export: {e}")))?;
        return Ok(());
    }
    if a.has("gzip") {
        return Err(Fail::new("export: --gzip is not supported by cocoon-sim"));
    }
    let out = a.get("output").map(str::to_string).unwrap_or_else(|| {
        format!(
            "{}.tar",
            if name.is_empty() {
                &entry.record.config.id
            } else {
                &name
            }
        )
    });
    let result = if out == "-" {
        let w = DieAfter {
            inner: std::io::stdout().lock(),
            left: ctx.die_after,
        };
        crate::tarfmt::export(&envelope, dir, w).and_then(|mut w| w.flush())
    } else {
        let w = DieAfter {
            inner: std::io::BufWriter::new(File::create(&out)?),
            left: ctx.die_after,
        };
        crate::tarfmt::export(&envelope, dir, w).and_then(|mut w| w.flush())
    };
    result.map_err(|e| Fail::new(format!("export: {e}")))
}

/// Reader that SIGKILLs the process once `limit` bytes were read (the `die` fault).
pub struct DieAfterRead<R> {
    pub inner: R,
    pub left: Option<u64>,
}

impl<R: Read> Read for DieAfterRead<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if let Some(left) = self.left {
            if left == 0 {
                die();
            }
            let n = buf.len().min(left as usize);
            let n = self.inner.read(&mut buf[..n])?;
            self.left = Some(left - n as u64);
            return Ok(n);
        }
        self.inner.read(buf)
    }
}

fn import(ctx: &Ctx, a: &crate::cli::Args) -> Res {
    let input: Box<dyn Read> = match a.positionals.first() {
        Some(f) if f != "-" => Box::new(File::open(f).map_err(|e| Fail::new(format!("import: open {f}: {e}")))?),
        _ => Box::new(std::io::stdin().lock()),
    };
    let mut input = std::io::BufReader::new(DieAfterRead {
        inner: input,
        left: ctx.die_after,
    });
    {
        use std::io::BufRead;
        let head = input.fill_buf()?;
        if head.starts_with(&[0x1f, 0x8b]) {
            return Err(Fail::new(
                "import: gzip-compressed archives are not supported by cocoon-sim",
            ));
        }
    }
    let id = crate::util::new_id();
    let staging = ctx.store.path("snapshots").join(format!(".import-{id}"));
    let result = crate::tarfmt::import(&mut input, &staging);
    let _ = std::io::copy(&mut input, &mut std::io::sink());
    let envelope = match result {
        Ok(env) => env,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(match e {
                crate::tarfmt::ImportError::Invalid(m) => Fail::new(m),
                crate::tarfmt::ImportError::Io(e) => Fail::new(format!("import: {e}")),
            });
        }
    };
    let name = a
        .get("name")
        .map(str::to_string)
        .unwrap_or(envelope.config.name.clone());
    let final_dir = ctx.store.snapshot_dir(&id);
    let registered = ctx.store.update(|s| -> Result<(), Fail> {
        if !valid_name(&name) {
            return Err(Fail::new(format!("invalid snapshot name {name:?}")));
        }
        if let Some(holder) = name_holder(s, &name) {
            return Err(Fail::new(format!(
                "snapshot name \"{name}\" already in use by {holder}"
            )));
        }
        std::fs::rename(&staging, &final_dir)?;
        let mut config = envelope.config.clone();
        config.id = id.clone();
        config.name = name.clone();
        if let Some(d) = a.get("description") {
            config.description = d.into();
        }
        let seq = s.next_seq();
        s.snapshots.insert(
            id.clone(),
            SnapshotEntry {
                record: SnapshotRecord {
                    config,
                    created_at: now_rfc3339(),
                },
                pending: false,
                data_dir: final_dir.display().to_string(),
                seq,
            },
        );
        Ok(())
    });
    if registered.is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    registered?;
    log(&format!("snapshot imported: {id}"));
    Ok(())
}
