//! The wake's middle tier, after a verified local snapshot and before a registry pull: restore the
//! hibernated guest's raw files from the node its `:hibernate` manifest names as `from-node`,
//! staged for `vm clone --from-dir`. Best effort: every reason to skip or failure returns why, and
//! the wake pulls from the registry.

use std::net::SocketAddr;
use std::time::Instant;

use super::CocoonProvider;
use super::plan;
use super::ports::SnapshotRegistry;
use crate::peer::{PeerTier, Restored};
use crate::registry::media::ANN_FROM_NODE;
use crate::runtime::SnapshotRecord;

/// A guest restored from its peer.
pub(super) struct PeerWake {
    pub staged: Restored,
    /// The snapshot's record, read from the envelope (image, hypervisor for the base-image ensure).
    pub record: SnapshotRecord,
    pub peer: String,
}

/// Why the peer tier was not used.
pub(super) enum Skipped {
    /// Nothing to try (no peer named, the peer is this node, no address): not a failure.
    NotApplicable(String),
    /// Tried and failed: counted and reported in the wake's Event.
    Failed(String),
}

pub(super) async fn restore_from_peer(
    p: &CocoonProvider,
    tier: &PeerTier,
    registry: &dyn SnapshotRegistry,
    vm: &str,
) -> Result<PeerWake, Skipped> {
    let tag = plan::HIBERNATE_SNAPSHOT_TAG;
    let manifest = match registry.manifest(vm, tag).await {
        Ok(Some(m)) => m,
        Ok(None) => return Err(Skipped::NotApplicable(format!("{vm}:{tag} is absent"))),
        Err(e) => return Err(Skipped::NotApplicable(format!("reading {vm}:{tag}: {e}"))),
    };
    let peer = manifest.annotations.get(ANN_FROM_NODE).cloned().unwrap_or_default();
    if peer.is_empty() {
        return Err(Skipped::NotApplicable(format!("{vm}:{tag} names no from-node")));
    }
    if peer == p.cfg.node_name {
        return Err(Skipped::NotApplicable(format!(
            "{vm}:{tag} was hibernated on this node"
        )));
    }
    let content = match registry.snapshot_content(vm, tag).await {
        Ok(Some(found)) => found,
        Ok(None) => return Err(Skipped::NotApplicable(format!("no snapshot config for {vm}:{tag}"))),
        Err(e) => return Err(Skipped::Failed(format!("reading the config of {vm}:{tag}: {e}"))),
    };
    // The registry says what the snapshot is; a copy that cannot be checked against it is not
    // taken from a peer at all.
    let files = match content.files {
        Ok(files) => files,
        Err(why) => {
            tracing::info!(vm, %peer, %why, "the peer's copy could not be checked against the registry; pulling from the registry");
            return Err(Skipped::NotApplicable(format!(
                "{vm}:{tag} cannot be checked file by file against the registry ({why})"
            )));
        }
    };
    let want_id = content.config.snapshot_id.clone();
    let envelope = content.config.envelope(vm);
    let record = record_of(&envelope).map_err(|e| Skipped::Failed(e.to_string()))?;
    let ip = match tier.nodes.internal_ip(&peer).await {
        Ok(Some(ip)) => ip,
        Ok(None) => return Err(Skipped::NotApplicable(format!("node {peer} has no InternalIP"))),
        Err(e) => return Err(Skipped::Failed(format!("looking up node {peer}: {e}"))),
    };
    let started = Instant::now();
    match tier
        .client
        .restore(SocketAddr::new(ip, tier.port), &peer, vm, &want_id, &envelope, &files)
        .await
    {
        Ok(staged) => {
            tier.metrics.restore.with_label_values(&["ok"]).inc();
            tier.metrics.restore_duration.observe(started.elapsed().as_secs_f64());
            tracing::info!(vm, %peer, received = staged.received, written = staged.written, seconds = started.elapsed().as_secs_f64(), "snapshot restored from its peer");
            Ok(PeerWake { staged, record, peer })
        }
        Err(e) => {
            tier.metrics.restore.with_label_values(&["failed"]).inc();
            tracing::warn!(vm, %peer, error = %e, "peer restore failed; pulling from the registry instead");
            Err(Skipped::Failed(format!("restore from peer {peer}: {e}")))
        }
    }
}

/// A snapshot config whose envelope does not hold a snapshot record.
#[derive(Debug, thiserror::Error)]
#[error("the registry's snapshot config does not make a snapshot.json: {0}")]
struct NotASnapshotRecord(#[source] serde_json::Error);

/// The snapshot record inside a `snapshot.json` envelope (its config uses the record's keys).
fn record_of(envelope: &[u8]) -> Result<SnapshotRecord, NotASnapshotRecord> {
    #[derive(serde::Deserialize)]
    struct Envelope {
        config: SnapshotRecord,
    }
    serde_json::from_slice::<Envelope>(envelope)
        .map(|e| e.config)
        .map_err(NotASnapshotRecord)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_envelope_gives_the_record() {
        let r = record_of(br#"{"version":1,"config":{"id":"S","name":"vk-a","image":"img:1","hypervisor":"cloud-hypervisor","cpu":2}}"#)
            .unwrap();
        assert_eq!((r.id.as_str(), r.image.as_str()), ("S", "img:1"));
        assert!(record_of(b"{}").is_err());
    }
}
