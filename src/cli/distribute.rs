//! `vk-cocoon policy push | pull`: policies as OCI artifacts. A push validates the component for
//! its slot and runs its case table first (a registry only ever holds components that passed);
//! a pull fetches by digest (or resolves a tag once), verifies every digest, validates and tests
//! the component like the daemon would, and writes it with its table.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, anyhow, bail};
use clap::Args;

use vk_cocoon::policy::cases::CaseTable;
use vk_cocoon::policy::distribution::{MAX_LAYER_BYTES, Pin, PolicyArtifact, PolicyFetcher, PolicyRef, registry_for};
use vk_cocoon::policy::{
    LoadError, LoadedPolicy, Origin, PolicyEngine, PolicySlot, SandboxLimits, Slot, SlotVisitor, with_slot,
};

#[derive(Debug, Args)]
pub struct PushArgs {
    /// The `.wasm` component.
    file: PathBuf,
    /// Where to push it: `oci://HOST[:PORT]/REPOSITORY:TAG`.
    reference: String,
    /// The slot it serves (default: the one slot the component implements).
    #[arg(long)]
    slot: Option<Slot>,
    /// Its case table, pushed as the artifact's second layer and run before the push (default:
    /// `<file without .wasm>.cases.yaml` beside it, if present).
    #[arg(long)]
    cases: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct PullArgs {
    /// `oci://HOST[:PORT]/REPOSITORY@sha256:DIGEST` (a `:TAG` is resolved once and printed).
    reference: String,
    /// Directory to write `<slot>.wasm` and `<slot>.cases.yaml` into.
    #[arg(long, short = 'o', default_value = ".")]
    output: PathBuf,
}

fn engine() -> anyhow::Result<PolicyEngine> {
    PolicyEngine::new(SandboxLimits::default()).map_err(|e| anyhow!("cannot start the wasm engine: {e:#}"))
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the I/O runtime")
}

/// Validates `bytes` for `slot` and runs `table` against it; returns the contract version.
struct Vet<'a> {
    engine: &'a PolicyEngine,
    origin: Origin,
    bytes: &'a [u8],
    table: Option<(&'a str, &'a CaseTable)>,
}

impl SlotVisitor for Vet<'_> {
    type Output = anyhow::Result<String>;
    fn visit<S: PolicySlot>(self) -> Self::Output {
        let policy = LoadedPolicy::<S>::load(self.engine, None, self.origin.clone(), self.bytes)?;
        if let Some((name, table)) = self.table {
            if table.slot != S::SLOT {
                bail!("case table {name} is for slot {}, not {}", table.slot, S::SLOT);
            }
            let results = table.run(self.engine, &policy);
            let failed: Vec<_> = results
                .iter()
                .filter_map(|r| Some((&r.name, r.failure.as_ref()?)))
                .collect();
            if let Some((case, why)) = failed.first() {
                bail!(
                    "{} fails its case table {name}: {} of {} cases failed (first: {case}: {why})",
                    self.origin,
                    failed.len(),
                    results.len()
                );
            }
            eprintln!("{}: {} cases of {name} pass", self.origin, results.len());
        }
        Ok(policy.version().to_string())
    }
}

/// The one slot a component implements.
fn implemented_slot(engine: &PolicyEngine, origin: &Origin, bytes: &[u8]) -> anyhow::Result<Slot> {
    struct Implements<'a>(&'a PolicyEngine, &'a Origin, &'a [u8]);
    impl SlotVisitor for Implements<'_> {
        type Output = Result<(), LoadError>;
        fn visit<S: PolicySlot>(self) -> Self::Output {
            LoadedPolicy::<S>::load(self.0, None, self.1.clone(), self.2).map(drop)
        }
    }
    let mut found = Vec::new();
    let mut first_error = None;
    for slot in Slot::ALL {
        match with_slot(slot, Implements(engine, origin, bytes)) {
            Ok(()) => found.push(slot),
            Err(error) => first_error = first_error.or(Some(error)),
        }
    }
    match found.as_slice() {
        [slot] => Ok(*slot),
        [] => Err(anyhow!(
            "{origin} implements no policy slot ({})",
            first_error.map_or_else(String::new, |e| e.to_string())
        )),
        many => bail!("{origin} implements several slots ({many:?}): say which with --slot"),
    }
}

pub fn push(args: PushArgs) -> anyhow::Result<ExitCode> {
    let reference = PolicyRef::parse(&args.reference).map_err(|e| anyhow!(e))?;
    let Pin::Tag(tag) = &reference.pin else {
        bail!("push to a tag (oci://HOST/REPOSITORY:TAG); the registry names the digest, which this command prints");
    };
    let engine = engine()?;
    let bytes = fs::read(&args.file).with_context(|| format!("cannot read {}", args.file.display()))?;
    // Refused here rather than by every node's pull of it.
    if bytes.len() as u64 > MAX_LAYER_BYTES {
        bail!(
            "{} is {} bytes: a policy artifact's component may be at most {MAX_LAYER_BYTES} bytes ({} MiB), the most a node pulls",
            args.file.display(),
            bytes.len(),
            MAX_LAYER_BYTES >> 20
        );
    }
    let origin = Origin::File(args.file.clone());
    let slot = match args.slot {
        Some(slot) => slot,
        None => implemented_slot(&engine, &origin, &bytes)?,
    };
    let cases_path = args.cases.clone().or_else(|| {
        let beside = args.file.with_extension("cases.yaml");
        beside.exists().then_some(beside)
    });
    let cases_text = match &cases_path {
        Some(path) => Some(fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?),
        None => None,
    };
    let table = match (&cases_path, &cases_text) {
        (Some(path), Some(text)) => Some(CaseTable::parse(text, &path.display().to_string()).map_err(|e| anyhow!(e))?),
        _ => None,
    };
    let shown = cases_path.as_ref().map(|p| p.display().to_string()).unwrap_or_default();
    let vet = Vet {
        engine: &engine,
        origin: origin.clone(),
        bytes: &bytes,
        table: table.as_ref().map(|t| (shown.as_str(), t)),
    };
    let contract = with_slot(slot, vet)?;
    let artifact = PolicyArtifact {
        slot,
        contract: contract.clone(),
        component: bytes,
        cases: cases_text.map(String::into_bytes),
    };
    let name = args.file.file_name().and_then(|n| n.to_str()).unwrap_or("policy.wasm");
    let created = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let upload = artifact.upload(name, &created);
    let digest = runtime()?.block_on(async {
        registry_for(&reference)?
            .push_artifact(&reference.repository, tag, &upload)
            .await
            .map_err(|e| anyhow!("pushing {reference}: {e}"))
    })?;
    eprintln!("pushed slot {slot} ({contract}) as {reference}");
    // The pinned reference alone on stdout: what VK_POLICY_* / the policy config names.
    println!("{}", reference.at_digest(&digest));
    Ok(ExitCode::SUCCESS)
}

pub fn pull(args: PullArgs) -> anyhow::Result<ExitCode> {
    let reference = PolicyRef::parse(&args.reference).map_err(|e| anyhow!(e))?;
    // Nothing is kept: a pull for inspection leaves no artifact store behind.
    let store = tempfile::tempdir().context("a scratch artifact store")?;
    let fetcher = PolicyFetcher::new(store.path(), true);
    let fetched = runtime()?.block_on(fetcher.fetch(&reference))?;
    let artifact = &fetched.artifact;
    let cases_text = artifact.cases.as_ref().map(|b| String::from_utf8_lossy(b).into_owned());
    let table_name = format!("the case table in {}", fetched.reference);
    let table = match &cases_text {
        Some(text) => Some(CaseTable::parse(text, &table_name).map_err(|e| anyhow!(e))?),
        None => None,
    };
    let engine = engine()?;
    let vet = Vet {
        engine: &engine,
        origin: Origin::Oci(fetched.reference.clone()),
        bytes: &artifact.component,
        table: table.as_ref().map(|t| (table_name.as_str(), t)),
    };
    let contract = with_slot(artifact.slot, vet)?;
    fs::create_dir_all(&args.output).with_context(|| format!("cannot create {}", args.output.display()))?;
    let component_path = write(&args.output, &format!("{}.wasm", artifact.slot), &artifact.component)?;
    if let Some(text) = &cases_text {
        write(&args.output, &format!("{}.cases.yaml", artifact.slot), text.as_bytes())?;
    }
    eprintln!(
        "pulled slot {} ({contract}) to {}",
        artifact.slot,
        component_path.display()
    );
    println!("{}", fetched.reference);
    Ok(ExitCode::SUCCESS)
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> anyhow::Result<PathBuf> {
    let path = dir.join(name);
    fs::write(&path, bytes).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}
