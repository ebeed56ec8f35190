//! What one instance of a component needs, read from its bytes before it is compiled: the core
//! instances it creates, the memories and tables its core modules define, and their initial
//! sizes. The host picks the instance pool from it (see [`super::engine`]) and refuses, at load
//! and without compiling, a component the slot's limits do not admit.
//!
//! The Rust guests need one core module and a few canonical-ABI shims; componentize-py's
//! CPython links dozens of modules (38 core instances, a 12 MiB heap image), QuickJS a dozen
//! with three memories. Reading the bytes costs a linear scan; compiling a large component
//! costs tens of seconds, so a component that cannot run is refused before that.

use wasmparser::{Instance, Parser, Payload};

use super::limits::{InstanceShape, SandboxLimits};

/// The resources one instance of a component creates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ComponentShape {
    /// Core module instantiations (the component's own and those of nested components).
    pub core_instances: u32,
    /// Linear memories defined (not imported) by its core modules.
    pub memories: u32,
    /// Tables defined by its core modules.
    pub tables: u32,
    /// The largest initial size of one memory, in bytes.
    pub max_initial_memory_bytes: u64,
    /// The most elements one table starts with.
    pub max_initial_table_elements: u64,
}

impl ComponentShape {
    /// Reads the shape of the component in `bytes`. Nested components are counted once each,
    /// as they are written; wasmtime's own count (checked again when the pool instantiates the
    /// component at load) is the last word.
    pub fn read(bytes: &[u8]) -> Result<Self, String> {
        let mut shape = ComponentShape::default();
        for payload in Parser::new(0).parse_all(bytes) {
            match payload.map_err(|e| e.to_string())? {
                Payload::InstanceSection(reader) => {
                    for instance in reader {
                        if let Instance::Instantiate { .. } = instance.map_err(|e| e.to_string())? {
                            shape.core_instances += 1;
                        }
                    }
                }
                Payload::MemorySection(reader) => {
                    for memory in reader {
                        let memory = memory.map_err(|e| e.to_string())?;
                        shape.memories += 1;
                        let initial = memory.initial.saturating_mul(memory.page_size().into());
                        shape.max_initial_memory_bytes = shape.max_initial_memory_bytes.max(initial);
                    }
                }
                Payload::TableSection(reader) => {
                    for table in reader {
                        let table = table.map_err(|e| e.to_string())?;
                        shape.tables += 1;
                        shape.max_initial_table_elements = shape.max_initial_table_elements.max(table.ty.initial);
                    }
                }
                // Imported memories and tables are not counted: they belong to the core
                // instance that defines them.
                _ => {}
            }
        }
        Ok(shape)
    }

    /// Whether one instance fits in `shape`.
    pub fn fits(&self, shape: &InstanceShape) -> bool {
        self.core_instances <= shape.core_instances
            && self.memories <= shape.memories
            && self.tables <= shape.tables
            && self.max_initial_table_elements <= shape.table_elements as u64
    }

    /// The first of the slot's limits this component needs more than, as a sentence naming the
    /// setting that raises it; `None` when every limit admits it.
    pub fn exceeds(&self, limits: &SandboxLimits) -> Option<String> {
        let checks: [(&str, &str, &str, u64, u64); 5] = [
            (
                "core instances",
                "max-core-instances",
                "VK_POLICY_MAX_CORE_INSTANCES",
                self.core_instances.into(),
                limits.max_core_instances.into(),
            ),
            (
                "linear memories",
                "max-memories",
                "VK_POLICY_MAX_MEMORIES",
                self.memories.into(),
                limits.max_memories.into(),
            ),
            (
                "tables",
                "max-tables",
                "VK_POLICY_MAX_TABLES",
                self.tables.into(),
                limits.max_tables.into(),
            ),
            (
                "table elements (in one table, initially)",
                "max-table-elements",
                "VK_POLICY_MAX_TABLE_ELEMENTS",
                self.max_initial_table_elements,
                limits.max_table_elements.into(),
            ),
            (
                "bytes of initial memory (in one memory)",
                "memory-bytes",
                "VK_POLICY_MEMORY_MIB",
                self.max_initial_memory_bytes,
                limits.memory_bytes as u64,
            ),
        ];
        checks
            .into_iter()
            .find(|(_, _, _, needed, allowed)| needed > allowed)
            .map(|(what, key, env, needed, allowed)| {
                format!(
                    "it needs {needed} {what}, more than the limit of {allowed}: raise limits.{key} in the policy configuration (or {env}) if the node can afford it"
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::limits::PER_DECISION;
    use crate::policy::slots::{CpuClassAdmission, PolicySlot};

    #[test]
    fn the_rust_defaults_fit_the_small_shape() {
        let shape = ComponentShape::read(CpuClassAdmission::default_component()).unwrap();
        assert!(shape.core_instances >= 1 && shape.memories >= 1, "{shape:?}");
        assert!(shape.fits(&PER_DECISION), "{shape:?}");
        assert_eq!(shape.exceeds(&SandboxLimits::default()), None);
    }

    #[test]
    fn each_limit_is_named_with_its_setting() {
        let shape = ComponentShape {
            core_instances: 38,
            memories: 3,
            tables: 2,
            max_initial_memory_bytes: 12 << 20,
            max_initial_table_elements: 9000,
        };
        assert_eq!(shape.exceeds(&SandboxLimits::default()), None);
        assert!(!shape.fits(&PER_DECISION));
        let cases = [
            (
                SandboxLimits {
                    max_core_instances: 16,
                    ..SandboxLimits::default()
                },
                "38 core instances, more than the limit of 16: raise limits.max-core-instances",
            ),
            (
                SandboxLimits {
                    max_memories: 2,
                    ..SandboxLimits::default()
                },
                "3 linear memories, more than the limit of 2: raise limits.max-memories",
            ),
            (
                SandboxLimits {
                    max_tables: 1,
                    ..SandboxLimits::default()
                },
                "(or VK_POLICY_MAX_TABLES)",
            ),
            (
                SandboxLimits {
                    max_table_elements: 100,
                    ..SandboxLimits::default()
                },
                "9000 table elements",
            ),
            (
                SandboxLimits {
                    memory_bytes: 8 << 20,
                    ..SandboxLimits::default()
                },
                "12582912 bytes of initial memory (in one memory), more than the limit of 8388608: raise limits.memory-bytes in the policy configuration (or VK_POLICY_MEMORY_MIB)",
            ),
        ];
        for (limits, expected) in cases {
            let message = shape.exceeds(&limits).expect("refused");
            assert!(message.contains(expected), "{message}");
        }
    }

    #[test]
    fn garbage_is_an_error_not_a_shape() {
        assert!(ComponentShape::read(b"\0asm\x0d\0\x01\0\xff\xff").is_err());
    }
}
