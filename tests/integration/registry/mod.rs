//! The registry adapter against Debian's docker-registry on loopback: round trips, v2 artifacts,
//! cloud images and faults; what the provider does with an artifact that is bad in itself.

mod bad_artifact;
mod cloud_image;
mod faults;
mod roundtrip;
mod v2;
