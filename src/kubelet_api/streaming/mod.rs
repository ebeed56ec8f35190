//! The streaming half of the kubelet API: `exec`, `attach` and `portForward` for VM pods.
//!
//! Transports: [`spdy`] (what the apiserver speaks to a kubelet unless the node declares
//! `ExtendWebSocketsToKubelet`).

pub mod spdy;
