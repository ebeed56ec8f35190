//! The registry adapter against Debian's docker-registry on loopback: round trips, v2 artifacts,
//! cloud images and faults; the snapshot config's modes and sparse maps; what a hostile registry may
//! send (and the small hostile servers that send it); what the provider does with an artifact that
//! is bad in itself.

mod bad_artifact;
mod cloud_image;
mod faults;
mod hostile;
mod roundtrip;
mod snapshot_config;
mod v2;
