//! The limits a snapshot transfer is measured against, each on the same bytes as the transfer: in-process
//! SHA-256 (the `sha2` crate the pull's verification runs on, with its runtime-detected SHA-NI path), the
//! registry's ingest limit (one monolithic PUT of a pre-hashed blob with curl) and serve limit (one GET
//! with curl), `skopeo copy` push and pull, and the command-line hashers (`openssl dgst`, `sha256sum`).

use sha2::Digest as _;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Hashes `path` in 8 MiB reads (page-cache speed, far above the hash), returning the digest and the time.
pub fn sha2_file(path: &Path) -> (String, Duration) {
    let mut f = std::fs::File::open(path).unwrap();
    let mut buf = vec![0u8; 8 << 20];
    let mut h = sha2::Sha256::new();
    let t = Instant::now();
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    let d = t.elapsed();
    (format!("sha256:{}", hex::encode(h.finalize())), d)
}

/// Whether the CPU offers the SHA extensions `sha2` switches to at run time (`cpufeatures`: sha + sse4.1).
pub fn sha_ni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("sha") && std::arch::is_x86_feature_detected!("sse4.1")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn timed(cmd: &mut Command) -> Duration {
    let t = Instant::now();
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let d = t.elapsed();
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    d
}

pub fn openssl(path: &Path) -> Duration {
    timed(Command::new("openssl").args(["dgst", "-sha256"]).arg(path))
}

pub fn sha256sum(path: &Path) -> Duration {
    timed(Command::new("sha256sum").arg(path))
}

/// `POST /v2/<repo>/blobs/uploads/`, then one `PUT <location>&digest=…` streaming the file (timed).
pub fn ingest(host: &str, repo: &str, path: &Path, digest: &str) -> Duration {
    let out = Command::new("curl")
        .args(["-sS", "-o", "/dev/null", "-D", "-", "-X", "POST"])
        .arg(format!("http://{host}/v2/{repo}/blobs/uploads/"))
        .output()
        .unwrap();
    let head = String::from_utf8_lossy(&out.stdout);
    let location = head
        .lines()
        .find_map(|l| {
            l.split_once(':')
                .filter(|(k, _)| k.eq_ignore_ascii_case("location"))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| panic!("no upload location: {head}"));
    let location = if location.starts_with('/') {
        format!("http://{host}{location}")
    } else {
        location
    };
    let sep = if location.contains('?') { '&' } else { '?' };
    timed(
        Command::new("curl")
            .args(["-sS", "--fail", "-o", "/dev/null", "-X", "PUT"])
            .args(["-H", "Content-Type: application/octet-stream", "-T"])
            .arg(path)
            .arg(format!("{location}{sep}digest={digest}")),
    )
}

/// One `GET /v2/<repo>/blobs/<digest>` to /dev/null.
pub fn serve(host: &str, repo: &str, digest: &str) -> Duration {
    timed(
        Command::new("curl")
            .args(["-sS", "--fail", "-o", "/dev/null"])
            .arg(format!("http://{host}/v2/{repo}/blobs/{digest}")),
    )
}

/// An OCI image layout holding `blob` (hard-linked, else copied) as the single layer of an image, for
/// `skopeo copy oci:<dir>:bench`. The layer keeps its uncompressed media type (`--preserve-digests`).
pub fn oci_layout(dir: &Path, blob: &Path, digest: &str) -> PathBuf {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let hex = digest.strip_prefix("sha256:").unwrap();
    let target = blobs.join(hex);
    if std::fs::hard_link(blob, &target).is_err() {
        std::fs::copy(blob, &target).unwrap();
    }
    let size = std::fs::metadata(blob).unwrap().len();
    let put = |bytes: Vec<u8>| {
        let d = hex::encode(sha2::Sha256::digest(&bytes));
        std::fs::write(blobs.join(&d), &bytes).unwrap();
        (format!("sha256:{d}"), bytes.len())
    };
    let config = serde_json::json!({"architecture": "amd64", "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [digest]}});
    let (cd, cs) = put(serde_json::to_vec(&config).unwrap());
    let manifest = serde_json::json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": cs},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": digest, "size": size}]});
    let (md, ms) = put(serde_json::to_vec(&manifest).unwrap());
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": md, "size": ms, "annotations": {"org.opencontainers.image.ref.name": "bench"}}]});
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    dir.to_path_buf()
}

fn skopeo(src: &str, dst: &str) -> Duration {
    timed(
        Command::new("skopeo")
            .args(["copy", "--quiet", "--preserve-digests"])
            .args(["--src-tls-verify=false", "--dest-tls-verify=false", src, dst]),
    )
}

/// `skopeo copy` of the layout to `docker://<host>/<repo>:bench`.
pub fn skopeo_push(layout: &Path, host: &str, repo: &str) -> Duration {
    skopeo(
        &format!("oci:{}:bench", layout.display()),
        &format!("docker://{host}/{repo}:bench"),
    )
}

/// `skopeo copy` of `docker://<host>/<repo>:bench` into a fresh layout under `dir` (removed after).
pub fn skopeo_pull(host: &str, repo: &str, dir: &Path) -> Duration {
    let out = dir.join("skopeo-pull");
    let d = skopeo(
        &format!("docker://{host}/{repo}:bench"),
        &format!("oci:{}:bench", out.display()),
    );
    std::fs::remove_dir_all(&out).unwrap();
    d
}

/// Removes `repo`'s link to `digest` (the blob data stays, for the repositories that still link it), so
/// skopeo's blob-info cache cannot turn the next push into a cross-repository mount.
pub fn unlink_blob(host: &str, repo: &str, digest: &str) {
    let _ = Command::new("curl")
        .args(["-sS", "-o", "/dev/null", "-X", "DELETE"])
        .arg(format!("http://{host}/v2/{repo}/blobs/{digest}"))
        .status();
}
