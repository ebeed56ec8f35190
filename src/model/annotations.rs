//! The pod annotation keys of the cocoon contract: the operator writes the VM spec, vk-cocoon the
//! runtime and lifecycle keys.

pub const VM_NAME: &str = "vm.cocoonstack.io/name";
pub const IMAGE: &str = "cocoonset.cocoonstack.io/image";
pub const MODE: &str = "cocoonset.cocoonstack.io/mode";
pub const OS: &str = "cocoonset.cocoonstack.io/os";
pub const STORAGE: &str = "cocoonset.cocoonstack.io/storage";
pub const NETWORK: &str = "cocoonset.cocoonstack.io/network";
pub const SNAPSHOT_POLICY: &str = "cocoonset.cocoonstack.io/snapshot-policy";
pub const MANAGED: &str = "cocoonset.cocoonstack.io/managed";
pub const FORCE_PULL: &str = "cocoonset.cocoonstack.io/force-pull";
pub const BACKEND: &str = "vm.cocoonstack.io/backend";
pub const NO_DIRECT_IO: &str = "vm.cocoonstack.io/no-direct-io";
pub const FORK_FROM: &str = "vm.cocoonstack.io/fork-from";
pub const CLONE_FROM_DIR: &str = "vm.cocoonstack.io/clone-from-dir";
pub const CONN_TYPE: &str = "vm.cocoonstack.io/conn-type";
pub const PROBE_PORT: &str = "vm.cocoonstack.io/probe-port";
pub const RESTORE_FROM_HIBERNATE: &str = "vm.cocoonstack.io/restore-from-hibernate";
pub const VM_ID: &str = "vm.cocoonstack.io/id";
pub const IP: &str = "vm.cocoonstack.io/ip";
pub const VNC_PORT: &str = "vm.cocoonstack.io/vnc-port";
pub const HIBERNATE: &str = "vm.cocoonstack.io/hibernate";
pub const KEEP_SNAPSHOT_ON_DELETE: &str = "vm.cocoonstack.io/keep-snapshot-on-delete";
/// The CocoonSet generation the operator stamps on the pod.
pub const GENERATION: &str = "cocoonset.cocoonstack.io/generation";

// Written by vk-cocoon: guest fixup progress, and its hint when retries are exhausted.
pub const POST_CLONE_STATE: &str = "vm.cocoonstack.io/post-clone-state";
pub const POST_CLONE_HINT: &str = "vm.cocoonstack.io/post-clone-hint";
pub const POST_CLONE_ERRORS: &str = "vm.cocoonstack.io/post-clone-errors";

// Written by vk-cocoon: its lifecycle intent (state, the CocoonSet generation it answers, a
// message).
pub const LIFECYCLE_STATE: &str = "vm.cocoonstack.io/lifecycle-state";
pub const LIFECYCLE_OBSERVED_GENERATION: &str = "vm.cocoonstack.io/lifecycle-observed-generation";
pub const LIFECYCLE_MESSAGE: &str = "vm.cocoonstack.io/lifecycle-state-message";

/// Node-selector key pinning a pod's snapshot CPU class.
pub const SNAPSHOT_CPU_CLASS: &str = "cocoonstack.io/snapshot-cpu-class";
