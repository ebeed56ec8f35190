//! Resource statistics of the node and of every VM, read straight from the
//! kernel's files: the VM scope's `cpu.stat`, the VMM's `/proc/<pid>/{status,stat,net/dev}`,
//! the COW disk's allocated size, `/proc/stat`, `/proc/meminfo` and `statvfs(COCOON_ROOT_DIR)`.
//!
//! * [`parse`]: the file formats (pure); [`paths`]: where the files are (configurable roots);
//! * [`sample`]: one sample of everything, cached by the [`Sampler`] for
//!   [`sample::SAMPLE_TTL`] and shared by `/stats/summary`, `/metrics/resource` and
//!   [`collector`] (`cocoon_vk_vm_*` on `:9091`); no cocoon CLI call per scrape; taken every
//!   [`sample::SAMPLE_INTERVAL`] as well, so that each carries the CPU rates (`usageNanoCores`)
//!   over it and the one before, as the kubelet's Summary does;
//! * [`families`]: metric families built from a sample, encoded by `prometheus`.

pub mod collector;
pub mod families;
pub mod parse;
pub mod paths;
pub mod sample;

pub use paths::HostPaths;
pub use sample::{Sample, Sampler, VmTarget, VmTargets};
