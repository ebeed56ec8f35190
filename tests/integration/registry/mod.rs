//! The registry adapter against Debian's docker-registry on loopback: round trips, v2 artifacts,
//! cloud images and faults.

mod cloud_image;
mod faults;
mod roundtrip;
mod v2;
