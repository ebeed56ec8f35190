//! `vk-cocoon policy test | eval | check`: the policy authors' tools. They run components in
//! the same sandbox, with the same limits, as the daemon.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};

use vk_cocoon::policy::cases::CaseTable;
use vk_cocoon::policy::input::{DecisionInput, facts_for};
use vk_cocoon::policy::{LoadError, LoadedPolicy, Origin, PolicyEngine, SandboxLimits, Slot, SlotDecision};

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Run case tables (`*.cases.yaml`, or directories holding them) inside the sandbox.
    Test(TestArgs),
    /// Evaluate one decision and print it as JSON.
    Eval(EvalArgs),
    /// Validate a component: readable, imports nothing, exports a slot's world.
    Check(CheckArgs),
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
    #[arg(long)]
    slot: Slot,
    /// YAML or JSON: `pod:` (a Pod manifest) and `host:` (the slot's host facts).
    #[arg(long)]
    input: PathBuf,
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
struct LimitArgs {
    /// Per-decision deadline in milliseconds.
    #[arg(long, default_value_t = 100)]
    timeout_ms: u64,
    /// Per-decision memory limit in MiB.
    #[arg(long, default_value_t = 32)]
    memory_mib: usize,
}

impl LimitArgs {
    fn engine(&self) -> anyhow::Result<PolicyEngine> {
        let limits = SandboxLimits {
            timeout: std::time::Duration::from_millis(self.timeout_ms),
            memory_bytes: self.memory_mib << 20,
            max_concurrent: 4,
        };
        PolicyEngine::new(limits).map_err(|e| anyhow::anyhow!("cannot start the wasm engine: {e:#}"))
    }
}

pub fn run(command: PolicyCommand) -> anyhow::Result<ExitCode> {
    match command {
        PolicyCommand::Test(args) => test(args),
        PolicyCommand::Eval(args) => eval(args),
        PolicyCommand::Check(args) => check(args),
    }
}

fn load_component(engine: &PolicyEngine, slot: Slot, path: Option<&Path>) -> Result<LoadedPolicy, LoadError> {
    match path {
        None => LoadedPolicy::builtin(engine, None, slot),
        Some(path) => {
            let bytes = fs::read(path).map_err(|source| LoadError::Read {
                path: path.to_path_buf(),
                source,
            })?;
            LoadedPolicy::load(engine, None, slot, Origin::File(path.to_path_buf()), &bytes)
        }
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
        let policy = match load_component(&engine, table.slot, component.as_deref()) {
            Ok(policy) => policy,
            Err(error) => {
                println!("FAIL {shown}: {error}");
                failed += table.cases.len();
                continue;
            }
        };
        println!(
            "# {shown}: slot {} on the {} ({})",
            table.slot,
            policy.origin(),
            &policy.digest()[..12]
        );
        for result in table.run(&engine, &policy) {
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
    let text = fs::read_to_string(&args.input).with_context(|| format!("cannot read {}", args.input.display()))?;
    let input: DecisionInput = serde_yaml_ng::from_str(&text)
        .with_context(|| format!("{} is not a decision input (`pod:` and `host:`)", args.input.display()))?;
    let facts = facts_for(args.slot, &input).map_err(|e| anyhow::anyhow!("{}: {e}", args.input.display()))?;
    let policy = load_component(&engine, args.slot, args.component.as_deref())?;
    let (decision, code) = match policy.decide(&engine, &facts) {
        Ok(decision) => (decision, ExitCode::SUCCESS),
        Err(error) => {
            eprintln!("error: {error}; printing the fail-safe decision the daemon would take");
            (SlotDecision::fail_safe(&facts, &error.to_string()), ExitCode::FAILURE)
        }
    };
    println!("{}", serde_json::to_string_pretty(&decision.to_json())?);
    Ok(code)
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
    let mut errors = Vec::new();
    let mut implemented = Vec::new();
    for slot in slots {
        match LoadedPolicy::load(&engine, None, slot, origin.clone(), &bytes) {
            Ok(policy) => implemented.push((slot, policy.digest().to_string())),
            Err(error) => errors.push(error),
        }
    }
    if let Some((slot, digest)) = implemented.first() {
        for (slot, _) in &implemented {
            println!(
                "{}: implements slot {slot} (world {}), imports no functions",
                args.file.display(),
                slot.world()
            );
        }
        println!("sha256 {digest} (first slot {slot})");
        return Ok(ExitCode::SUCCESS);
    }
    // Slot-independent problems (corrupt, imports) are the same for every slot: say them once.
    let first = errors.first().expect("at least one slot was checked");
    let slot_independent = matches!(
        first,
        LoadError::Corrupt { .. } | LoadError::ForbiddenImports { .. } | LoadError::Read { .. }
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
