//! The kubelet core against the fake apiserver: the node, the pod watch, status publication.

mod node;
mod pods;
mod status;
