//! `vk-cocoon policy test | eval | check | new | push | pull`: the policy authors' tools. They run components in
//! the same sandbox, with the same limits, as the daemon.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};

use vk_cocoon::policy::cases::{CaseResult, CaseTable, decision_json};
use vk_cocoon::policy::input::{DecisionInput, facts_for};
use vk_cocoon::policy::{
    ContractVersion, LoadError, LoadedPolicy, Origin, PolicyEngine, PolicySlot, SandboxLimits, Slot, SlotVisitor,
    with_slot,
};

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Run case tables (`*.cases.yaml`, or directories holding them) inside the sandbox.
    Test(TestArgs),
    /// Evaluate one decision and print it as JSON.
    Eval(EvalArgs),
    /// Per-case latency (p50 / p99) of a case table in the sandbox.
    Bench(super::bench::BenchArgs),
    /// Validate a component: readable, imports nothing, exports a slot's world.
    Check(CheckArgs),
    /// Create a policy for a slot (Rust, Python or JavaScript) that builds and passes its own table.
    New(NewArgs),
    /// Validate and test a component, then push it (with its case table) to an OCI registry;
    /// prints the digest-pinned reference to configure.
    Push(super::distribute::PushArgs),
    /// Fetch a policy artifact, verify, validate and test it, and write it with its table.
    Pull(super::distribute::PullArgs),
    /// The daemon's compiler process: a component on stdin, its compiled artifact on stdout.
    #[command(hide = true)]
    CompileWorker(CompileWorkerArgs),
}

/// How long and how big the compile may get.
#[derive(Debug, Args)]
pub struct CompileWorkerArgs {
    #[arg(long)]
    deadline_ms: u64,
    #[arg(long)]
    address_space_mib: u64,
}

#[derive(Debug, Args)]
pub struct NewArgs {
    /// The slot the policy serves.
    slot: Slot,
    /// A new (or empty) directory; the policy (crate, table, component) is named after it.
    dir: PathBuf,
    /// The language to write it in.
    #[arg(long, value_enum, default_value = "rust")]
    lang: super::scaffold::Lang,
}

#[derive(Debug, Args)]
pub struct TestArgs {
    /// Case tables, or directories searched recursively for `*.cases.yaml`.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Test this component instead of the table's own (`component:`, `<table>.wasm`, built-in).
    #[arg(long)]
    component: Option<PathBuf>,
    #[command(flatten)]
    limits: LimitArgs,
}

#[derive(Debug, Args)]
pub struct EvalArgs {
    #[arg(long, required_unless_present = "from_log")]
    slot: Option<Slot>,
    /// YAML or JSON: `pod:` (a Pod manifest) and `host:` (the slot's host facts).
    #[arg(long, required_unless_present = "from_log", conflicts_with = "from_log")]
    input: Option<PathBuf>,
    /// Replay a decision log line (VK_DECISION_LOG; `-` reads it from stdin) and compare the
    /// component's decision with the logged one: exit 1 when they differ.
    #[arg(long, value_name = "LINE", conflicts_with = "slot")]
    from_log: Option<String>,
    /// Component to evaluate (default: the slot's built-in policy).
    #[arg(long)]
    component: Option<PathBuf>,
    #[command(flatten)]
    limits: LimitArgs,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The `.wasm` component.
    file: PathBuf,
    /// Check against this slot only (default: report which slots it implements).
    #[arg(long)]
    slot: Option<Slot>,
}

#[derive(Debug, Args)]
pub(super) struct LimitArgs {
    /// Per-decision deadline in milliseconds.
    #[arg(long, default_value_t = 100)]
    timeout_ms: u64,
    /// Per-decision memory limit in MiB.
    #[arg(long, default_value_t = 32)]
    memory_mib: usize,
}

impl LimitArgs {
    pub(super) fn engine(&self) -> anyhow::Result<PolicyEngine> {
        let limits = SandboxLimits {
            timeout: std::time::Duration::from_millis(self.timeout_ms),
            memory_bytes: self.memory_mib << 20,
            max_concurrent: 4,
            ..SandboxLimits::default()
        };
        PolicyEngine::new(limits).map_err(|e| anyhow::anyhow!("cannot start the wasm engine: {e:#}"))
    }
}

pub fn run(command: PolicyCommand) -> anyhow::Result<ExitCode> {
    match command {
        PolicyCommand::Test(args) => test(args),
        PolicyCommand::Eval(args) => eval(args),
        PolicyCommand::Bench(args) => super::bench::bench(args),
        PolicyCommand::Check(args) => check(args),
        PolicyCommand::Push(args) => super::distribute::push(args),
        PolicyCommand::Pull(args) => super::distribute::pull(args),
        PolicyCommand::CompileWorker(args) => Ok(vk_cocoon::policy::compile_worker::serve(
            vk_cocoon::policy::compile_worker::CompileLimits {
                deadline: std::time::Duration::from_millis(args.deadline_ms),
                address_space_mib: args.address_space_mib,
            },
        )),
        PolicyCommand::New(args) => {
            let made = super::scaffold::scaffold(args.slot, args.lang, &args.dir)?;
            println!("{}", super::scaffold::next_steps(args.slot, &made));
            Ok(ExitCode::SUCCESS)
        }
    }
}

pub(super) fn load_component<S: PolicySlot>(
    engine: &PolicyEngine,
    path: Option<&Path>,
) -> Result<LoadedPolicy<S>, LoadError> {
    match path {
        None => LoadedPolicy::builtin(engine, None),
        Some(path) => {
            let bytes = fs::read(path).map_err(|source| LoadError::Read {
                path: path.to_path_buf(),
                source,
            })?;
            LoadedPolicy::load(engine, None, Origin::File(path.to_path_buf()), &bytes)
        }
    }
}

/// One table run against its component: the header line and the results, or why it could not
/// run.
struct TableRun<'a> {
    engine: &'a PolicyEngine,
    table: &'a CaseTable,
    component: Option<&'a Path>,
}

impl SlotVisitor for TableRun<'_> {
    type Output = Result<(String, Vec<CaseResult>), LoadError>;

    fn visit<S: PolicySlot>(self) -> Self::Output {
        let policy = load_component::<S>(self.engine, self.component)?;
        let header = format!(
            "slot {} on the {} ({}, contract {})",
            S::SLOT,
            policy.origin(),
            &policy.digest()[..12],
            policy.version()
        );
        Ok((header, self.table.run(self.engine, &policy)))
    }
}

fn test(args: TestArgs) -> anyhow::Result<ExitCode> {
    let engine = args.limits.engine()?;
    let mut tables = Vec::new();
    for path in &args.paths {
        collect_tables(path, &mut tables)
            .with_context(|| format!("cannot list case tables under {}", path.display()))?;
    }
    let (mut passed, mut failed) = (0usize, 0usize);
    for table_path in &tables {
        let shown = table_path.display();
        let table = match CaseTable::load(table_path) {
            Ok(table) => table,
            Err(error) => {
                println!("FAIL {shown}: {error}");
                failed += 1;
                continue;
            }
        };
        let component = args.component.clone().or_else(|| table.component_path(table_path));
        let run = TableRun {
            engine: &engine,
            table: &table,
            component: component.as_deref(),
        };
        let (header, results) = match with_slot(table.slot, run) {
            Ok(done) => done,
            Err(error) => {
                println!("FAIL {shown}: {error}");
                failed += table.cases.len();
                continue;
            }
        };
        println!("# {shown}: {header}");
        for result in results {
            match &result.failure {
                None => {
                    passed += 1;
                    println!("ok   {}", result.name);
                }
                Some(failure) => {
                    failed += 1;
                    println!("FAIL {}: {failure}", result.name);
                    println!("     decision: {}", result.decision);
                }
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    if passed + failed == 0 {
        eprintln!("error: no case ran; give case tables (*.cases.yaml) or directories holding them");
        return Ok(ExitCode::FAILURE);
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Case tables at `path`: the file itself, or every `*.cases.yaml` below a directory (sorted).
fn collect_tables(path: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    if !path.is_dir() {
        if !path.exists() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no such file or directory",
            ));
        }
        out.push(path.to_path_buf());
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = fs::read_dir(path)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    entries.sort();
    for entry in entries {
        let is_table = entry
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.ends_with(".cases.yaml"));
        if entry.is_dir() {
            // Build output of nested crates is never a place for tables.
            if entry.file_name().is_some_and(|n| n != "target") {
                collect_tables(&entry, out)?;
            }
        } else if is_table {
            out.push(entry);
        }
    }
    Ok(())
}

fn eval(args: EvalArgs) -> anyhow::Result<ExitCode> {
    let engine = args.limits.engine()?;
    if let Some(line) = &args.from_log {
        return super::replay::replay(&engine, line, args.component.as_deref());
    }
    let (Some(slot), Some(input_path)) = (args.slot, args.input.as_ref()) else {
        anyhow::bail!("give --slot and --input, or --from-log");
    };
    let text = fs::read_to_string(input_path).with_context(|| format!("cannot read {}", input_path.display()))?;
    let input: DecisionInput = serde_yaml_ng::from_str(&text)
        .with_context(|| format!("{} is not a decision input (`pod:` and `host:`)", input_path.display()))?;
    struct Eval<'a> {
        engine: &'a PolicyEngine,
        input: &'a DecisionInput,
        component: Option<&'a Path>,
    }
    impl SlotVisitor for Eval<'_> {
        type Output = anyhow::Result<serde_json::Value>;
        fn visit<S: PolicySlot>(self) -> Self::Output {
            let facts = facts_for::<S>(self.input).map_err(|e| anyhow::anyhow!("{e}"))?;
            let policy = load_component::<S>(self.engine, self.component)?;
            Ok(decision_json(self.engine, &policy, &facts))
        }
    }
    let eval = Eval {
        engine: &engine,
        input: &input,
        component: args.component.as_deref(),
    };
    let decision = with_slot(slot, eval).with_context(|| input_path.display().to_string())?;
    let code = match decision.get("fail-safe").and_then(|v| v.as_str()) {
        Some(error) => {
            eprintln!("error: {error}; printing the fail-safe decision the daemon would take");
            ExitCode::FAILURE
        }
        None => ExitCode::SUCCESS,
    };
    println!("{}", serde_json::to_string_pretty(&decision)?);
    Ok(code)
}

/// Bytes of the files below `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| match entry.metadata() {
            Ok(meta) if meta.is_dir() => dir_bytes(&entry.path()),
            Ok(meta) => meta.len(),
            Err(_) => 0,
        })
        .sum()
}

fn check(args: CheckArgs) -> anyhow::Result<ExitCode> {
    let engine = LimitArgs {
        timeout_ms: 100,
        memory_mib: 32,
    }
    .engine()?;
    let bytes = fs::read(&args.file).with_context(|| format!("cannot read {}", args.file.display()))?;
    let origin = Origin::File(args.file.clone());
    let slots = match args.slot {
        Some(slot) => vec![slot],
        None => Slot::ALL.to_vec(),
    };
    // What one instance creates, and which pool it runs in (before the compile it may refuse).
    if let Ok(shape) = vk_cocoon::policy::shape::ComponentShape::read(&bytes) {
        let pool = match shape.exceeds(&engine.limits()) {
            Some(_) => "beyond the limits",
            None if shape.fits(&vk_cocoon::policy::limits::PER_DECISION) => "the small pool",
            None => "the pool of large components",
        };
        println!(
            "{}: {} bytes; {} core instances, {} memories (largest initially {} KiB), {} tables: {pool}",
            args.file.display(),
            bytes.len(),
            shape.core_instances,
            shape.memories,
            shape.max_initial_memory_bytes >> 10,
            shape.tables,
        );
    }
    // Compiled once, not once per slot checked: a CPython component takes tens of seconds.
    let scratch = tempfile::tempdir().context("cannot create a scratch compile cache")?;
    let cache = vk_cocoon::policy::CompileCache::new(scratch.path());
    // What the component says it is, before any slot is checked.
    let started = std::time::Instant::now();
    if let Ok(exports) = vk_cocoon::policy::contract_exports(&engine, Some(&cache), &origin, &bytes) {
        println!(
            "{}: compiled in {:.1} s to {} KiB of native code (its compile cache entry)",
            args.file.display(),
            started.elapsed().as_secs_f64(),
            dir_bytes(scratch.path()) >> 10
        );
        for (interface, version) in &exports {
            let spoken = if ContractVersion::parse(version).is_some() {
                ""
            } else {
                " (a version this daemon does not speak)"
            };
            println!(
                "{}: exports {interface} of contract {}@{version}{spoken}",
                args.file.display(),
                ContractVersion::PACKAGE
            );
        }
    }
    struct Check<'a> {
        engine: &'a PolicyEngine,
        cache: &'a vk_cocoon::policy::CompileCache,
        origin: &'a Origin,
        bytes: &'a [u8],
    }
    impl SlotVisitor for Check<'_> {
        type Output = Result<(String, ContractVersion), LoadError>;
        fn visit<S: PolicySlot>(self) -> Self::Output {
            let policy = LoadedPolicy::<S>::load(self.engine, Some(self.cache), self.origin.clone(), self.bytes)?;
            Ok((policy.digest().to_string(), policy.version()))
        }
    }
    let mut errors = Vec::new();
    let mut implemented = Vec::new();
    for slot in slots {
        let check = Check {
            engine: &engine,
            cache: &cache,
            origin: &origin,
            bytes: &bytes,
        };
        match with_slot(slot, check) {
            Ok((digest, version)) => implemented.push((slot, digest, version)),
            Err(error) => errors.push(error),
        }
    }
    if let Some((slot, digest, _)) = implemented.first() {
        for (slot, _, version) in &implemented {
            let adapted = if *version == ContractVersion::CURRENT {
                String::new()
            } else {
                format!("; the host adapts it to {}", ContractVersion::CURRENT)
            };
            println!(
                "{}: implements slot {slot} (world {}) of contract {version}, imports no functions{adapted}",
                args.file.display(),
                slot.world()
            );
        }
        println!("sha256 {digest} (first slot {slot})");
        return Ok(ExitCode::SUCCESS);
    }
    // Slot-independent problems (corrupt, imports) are the same for every slot: say them once;
    // so is a contract version the daemon does not speak (the other slots are not exported).
    let Some(first) = errors
        .iter()
        .find(|e| matches!(e, LoadError::UnsupportedVersion { .. }))
        .or(errors.first())
    else {
        anyhow::bail!("no slot was checked");
    };
    let slot_independent = matches!(
        first,
        LoadError::Corrupt { .. }
            | LoadError::TooLarge { .. }
            | LoadError::ForbiddenImports { .. }
            | LoadError::Read { .. }
            | LoadError::UnsupportedVersion { .. }
    );
    if slot_independent || errors.len() == 1 {
        eprintln!("error: {first}");
    } else {
        eprintln!("error: {} implements none of the policy slots:", args.file.display());
        for error in &errors {
            eprintln!("  - {error}");
        }
    }
    Ok(ExitCode::FAILURE)
}
