//! `vk-cocoon policy bench TABLE [--component X.wasm]`: what each case of a table costs in the
//! sandbox the daemon uses (a fresh instance per decision, facts lowered and the decision lifted),
//! as p50 / p99 over many decisions — for authors to see the price of their policy.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use clap::Args;

use vk_cocoon::policy::cases::CaseTable;
use vk_cocoon::policy::input::{DecisionInput, facts_for, merge_contract};
use vk_cocoon::policy::{PolicyEngine, PolicySlot, SlotVisitor, with_slot};

use super::policy::LimitArgs;

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// The case table whose cases are the inputs.
    table: PathBuf,
    /// The component (default: the table's own — `component:`, `<table>.wasm`, else built-in).
    #[arg(long)]
    component: Option<PathBuf>,
    /// Decisions per case.
    #[arg(long, default_value_t = 2000)]
    iterations: usize,
    #[command(flatten)]
    limits: LimitArgs,
}

struct Bench<'a> {
    engine: &'a PolicyEngine,
    table: &'a CaseTable,
    component: Option<&'a std::path::Path>,
    iterations: usize,
}

/// Per case: (name, p50, p99, failed decisions).
type Rows = Vec<(String, Duration, Duration, usize)>;

impl SlotVisitor for Bench<'_> {
    type Output = anyhow::Result<(String, Rows)>;
    fn visit<S: PolicySlot>(self) -> Self::Output {
        let policy = super::policy::load_component::<S>(self.engine, self.component)?;
        let header = format!(
            "{} (sha256:{}, {})",
            policy.origin(),
            &policy.digest()[..12],
            policy.version()
        );
        let mut rows = Vec::new();
        for case in &self.table.cases {
            let mut host = self.table.defaults.host.clone();
            if !case.host.is_null() {
                merge_contract(&mut host, &case.host);
            }
            let mut pod = self.table.defaults.pod.clone();
            if !case.pod.is_null() {
                json_patch::merge(&mut pod, &case.pod);
            }
            let facts = facts_for::<S>(&DecisionInput { pod, host }).map_err(|e| anyhow!("case {}: {e}", case.name))?;
            // Warm the pool's slot and the code pages before timing.
            for _ in 0..self.iterations.min(50) {
                let _ = policy.decide(self.engine, &facts);
            }
            let mut samples = Vec::with_capacity(self.iterations);
            let mut failed = 0;
            for _ in 0..self.iterations {
                let started = Instant::now();
                let result = policy.decide(self.engine, std::hint::black_box(&facts));
                samples.push(started.elapsed());
                failed += usize::from(result.is_err());
            }
            samples.sort_unstable();
            let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
            rows.push((case.name.clone(), at(0.50), at(0.99), failed));
        }
        Ok((header, rows))
    }
}

fn us(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e6)
}

pub fn bench(args: BenchArgs) -> anyhow::Result<ExitCode> {
    let engine = args.limits.engine()?;
    let table = CaseTable::load(&args.table).map_err(|e| anyhow!(e))?;
    if args.iterations == 0 {
        anyhow::bail!("--iterations must be at least 1");
    }
    let component = args.component.clone().or_else(|| table.component_path(&args.table));
    let run = Bench {
        engine: &engine,
        table: &table,
        component: component.as_deref(),
        iterations: args.iterations,
    };
    let (header, rows) = with_slot(table.slot, run)?;
    println!(
        "# {}: slot {} on the {header}, {} decisions per case",
        args.table.display(),
        table.slot,
        args.iterations
    );
    let width = rows.iter().map(|r| r.0.len()).max().unwrap_or(4).max(4);
    println!("{:<width$}  {:>9}  {:>9}  failed", "case", "p50 µs", "p99 µs");
    for (name, p50, p99, failed) in &rows {
        println!("{name:<width$}  {:>9}  {:>9}  {failed}", us(*p50), us(*p99));
    }
    let mut all: Vec<Duration> = rows.iter().map(|r| r.1).collect();
    all.sort_unstable();
    if let Some(median) = all.get(all.len() / 2) {
        println!("median of the per-case p50s: {} µs", us(*median));
    }
    Ok(ExitCode::SUCCESS)
}
