//! `image …` verbs.

use crate::cli::{Ctx, Fail, FlagSpec, Kind, Res, log, parse, print_json};
use crate::model::ImageRecord;
use crate::snapshot::DieAfterRead;
use crate::store::State;
use crate::util::now_rfc3339;
use sha2::{Digest, Sha256};
use std::io::Read;

const PULL: FlagSpec = &[("force", None, Kind::Bool)];
const NONE: FlagSpec = &[];
const LIST: FlagSpec = &[("format", Some('o'), Kind::Value)];

pub fn dispatch(ctx: &Ctx, verb: &str, rest: &[String]) -> Res {
    match verb {
        "pull" => pull(ctx, &parse(rest, PULL)?),
        "inspect" => inspect(ctx, &parse(rest, NONE)?),
        "import" => import(ctx, &parse(rest, NONE)?),
        "list" | "ls" => {
            let a = parse(rest, LIST)?;
            let images: Vec<ImageRecord> = ctx.store.read(|s| s.images.values().cloned().collect())?;
            if a.get("format") == Some("json") {
                print_json(&images)
            } else {
                for i in images {
                    println!("{}\t{}\t{}\t{}", i.id, i.name, i.kind, i.size);
                }
                Ok(())
            }
        }
        other => Err(Fail::new(format!("unknown command \"{other}\" for \"cocoon image\""))),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn add_image(s: &mut State, name: &str, kind: &str, size: u64) -> ImageRecord {
    let rec = ImageRecord {
        id: hex(&Sha256::digest(name.as_bytes())),
        name: name.into(),
        kind: kind.into(),
        size,
        created_at: now_rfc3339(),
    };
    s.images.insert(name.into(), rec.clone());
    rec
}

fn pull(ctx: &Ctx, a: &crate::cli::Args) -> Res {
    if a.positionals.is_empty() {
        return Err(Fail::new("requires at least 1 arg(s), only received 0"));
    }
    for r in &a.positionals {
        let cloud = r.starts_with("http://") || r.starts_with("https://");
        if !cloud && (r.contains(' ') || r.is_empty() || r.starts_with('/')) {
            return Err(Fail::new(format!("image \"{r}\": invalid reference format")));
        }
        ctx.store.update(|s| -> Result<(), Fail> {
            if !s.images.contains_key(r) || (a.has("force") && cloud) {
                add_image(s, r, if cloud { "cloudimg" } else { "oci" }, 64 << 20);
            }
            Ok(())
        })?;
        log(&format!("pulled: {r}"));
    }
    Ok(())
}

fn inspect(ctx: &Ctx, a: &crate::cli::Args) -> Res {
    let r = a
        .positionals
        .first()
        .ok_or_else(|| Fail::new("accepts 1 arg(s), received 0"))?;
    let want = r.trim_start_matches("sha256:");
    let rec = ctx.store.read(|s| {
        s.images
            .get(r)
            .cloned()
            .or_else(|| s.images.values().find(|i| i.id == want).cloned())
    })?;
    match rec {
        Some(rec) => print_json(&rec),
        None => Err(Fail::new(format!("image \"{r}\": not found in any backend"))),
    }
}

fn import(ctx: &Ctx, a: &crate::cli::Args) -> Res {
    let name = a
        .positionals
        .first()
        .ok_or_else(|| Fail::new("requires at least 1 arg(s), only received 0"))?
        .clone();
    let mut readers: Vec<Box<dyn Read>> = Vec::new();
    if a.positionals.len() > 1 {
        for f in &a.positionals[1..] {
            readers.push(Box::new(
                std::fs::File::open(f).map_err(|e| Fail::new(format!("image import: open {f}: {e}")))?,
            ));
        }
    } else {
        readers.push(Box::new(std::io::stdin().lock()));
    }
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    let mut head = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut budget = ctx.die_after;
    for r in readers {
        let mut r = DieAfterRead { inner: r, left: budget };
        loop {
            let n = r.read(&mut buf)?;
            if n == 0 {
                break;
            }
            if head.len() < 512 {
                head.extend_from_slice(&buf[..n.min(512 - head.len())]);
            }
            hasher.update(&buf[..n]);
            size += n as u64;
        }
        budget = r.left;
    }
    let kind = if head.starts_with(b"QFI\xfb") {
        "cloudimg"
    } else if head.len() >= 262 && &head[257..262] == b"ustar" {
        "oci"
    } else if head.starts_with(&[0x1f, 0x8b]) {
        return Err(Fail::new(
            "image import: gzip-compressed input is not supported by cocoon-sim",
        ));
    } else {
        return Err(Fail::new("image import: unrecognized image format (want qcow2 or tar)"));
    };
    let id = hex(&hasher.finalize());
    ctx.store.update(|s| -> Result<(), Fail> {
        s.images.insert(
            name.clone(),
            ImageRecord {
                id: id.clone(),
                name: name.clone(),
                kind: kind.into(),
                size,
                created_at: now_rfc3339(),
            },
        );
        Ok(())
    })?;
    log(&format!("imported: {name} ({id})"));
    Ok(())
}
