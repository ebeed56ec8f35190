//! Step 1 of a bring-up: what this node has for the pod. A VM of its name (the table; cocoon
//! itself only when [`Lookup::Ask`]), a stale `creating` record settled first, the hibernate
//! evidence, the local snapshot of its image (known from the daemon's own calls, else asked).
//! Only reads, except settling the stale create.

use k8s_openapi::api::core::v1::Pod;

use super::super::CocoonProvider;
use super::super::failure::Failure;
use super::super::known::SnapshotFact;
use super::super::plan;
use super::super::reconcile::{self, InspectVerdict, StaleStep};
use crate::kubelet::EventReason;
use crate::model::{PodFacts, RuntimeAnnotations, VmSpec};
use crate::policy::contract::bring_up::{self, HibernateEvidence, LocalSnapshot};
use crate::policy::contract::types::BootMode;
use crate::runtime::{RuntimeError, SnapshotRecord, StaleCreateOutcome, VmRecord, VmState};

/// The pod a bring-up is for.
pub(in crate::provider) struct Ctx<'a> {
    pub pod: &'a Pod,
    pub facts: PodFacts,
    pub spec: VmSpec,
}

/// What the node has for the pod, before the policy is asked.
pub(super) struct Gathered {
    /// A VM of the pod's name, live or finished (a stale create already settled).
    pub existing: Option<VmRecord>,
    pub evidence: HibernateEvidence,
    /// The local snapshot of the pod's image, as cocoon reported it just now: the clone reuses
    /// it rather than asking again (if it went in between, the clone fails and the retry asks).
    pub image_snapshot: Option<SnapshotRecord>,
}

impl Gathered {
    /// The local snapshots as the bring-up policy sees them.
    pub fn local_snapshots(&self) -> Vec<LocalSnapshot> {
        self.image_snapshot.iter().map(plan::local_snapshot_fact).collect()
    }
}

/// Where a VM of the pod's name is looked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lookup {
    /// The VM table only. Safe without asking cocoon because every boot plan names the VM and
    /// cocoon keeps one VM per name (its store maps each name to one id): a VM of this name
    /// that the table misses (made behind the daemon's back, or before the startup reconcile
    /// indexed it) refuses the boot, which then asks ([`Lookup::Ask`]) and adopts it.
    Table,
    /// The table, then cocoon (`vm inspect`): after a bring-up that trusted the table failed.
    Ask,
}

pub(super) async fn gather(p: &CocoonProvider, ctx: &Ctx<'_>, lookup: Lookup) -> Result<Gathered, Failure> {
    let spec = &ctx.spec;
    let existing = match existing_vm(p, spec, lookup).await? {
        Some(vm) if vm.state == VmState::Creating => settle_stale(p, vm).await?,
        other => other,
    };
    let evidence = if existing.is_some() || !spec.managed {
        HibernateEvidence::NotChecked
    } else {
        hibernate_evidence(p, &spec.vm_name).await
    };
    let image_snapshot = if spec.managed && existing.is_none() && !spec.image.is_empty() && spec.mode != BootMode::Run {
        local_snapshot_of_image(p, &spec.image).await
    } else {
        None
    };
    Ok(Gathered {
        existing,
        evidence,
        image_snapshot,
    })
}

/// A VM of the pod's name: the table's, else (managed pods, when asked) cocoon's.
async fn existing_vm(p: &CocoonProvider, spec: &VmSpec, lookup: Lookup) -> Result<Option<VmRecord>, Failure> {
    let name = spec.vm_name.as_str();
    if let Some(vm) = p.state.vm_by_name(name) {
        return Ok(Some(vm));
    }
    if !spec.managed || lookup == Lookup::Table {
        return Ok(None);
    }
    match p.ports.runtime.inspect(name).await {
        Ok(vm) => Ok(Some(vm)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(Failure::transient(
            EventReason::VmInspectFailed,
            format!("checking whether vm {name} already exists: {e}"),
        )),
    }
}

/// The local snapshot cocoon keeps of the pod's image, if any (a fact for the policy; a lookup
/// error is the same as none: the policy then pulls). A snapshot the daemon's own calls saw is
/// not asked for again: if it went behind the daemon's back since, the clone fails, which
/// forgets it, and the retry asks. One not known present is always asked for, so a snapshot an
/// operator brought to the node (the fix a `SnapshotUnavailable` asks for) is found at once.
async fn local_snapshot_of_image(p: &CocoonProvider, image: &str) -> Option<SnapshotRecord> {
    let (repo, tag) = plan::parse_ref(image);
    let name = plan::local_snapshot_name(repo, tag);
    match p.known.snapshot(&name) {
        SnapshotFact::Present(record) => Some(*record),
        SnapshotFact::Absent | SnapshotFact::Unknown => p.ports.runtime.snapshot_inspect(&name).await.ok(),
    }
}

/// Settles a `creating` record of this pod's VM name by the startup reconcile's table
/// ([`reconcile::stale_step`], [`reconcile::after_inspect`]): collected or gone ⇒ none;
/// finished (running) ⇒ adopt; terminal (never finished, so no state) ⇒ removed; still owned or
/// undecidable ⇒ the create retries later.
async fn settle_stale(p: &CocoonProvider, vm: VmRecord) -> Result<Option<VmRecord>, Failure> {
    let outcome = p.ports.runtime.reconcile_stale_create(&vm.id).await;
    tracing::info!(vm = %vm.id, outcome = ?outcome.as_ref().map_err(ToString::to_string), "settling a stale create of this pod's vm");
    match reconcile::stale_step(&outcome) {
        StaleStep::Drop => return Ok(None),
        StaleStep::Watch => return Err(still_creating_or_failed(&vm, &outcome)),
        StaleStep::Inspect => {}
    }
    let current = match p.ports.runtime.inspect(&vm.id).await {
        Ok(current) => current,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => {
            return Err(Failure::transient(
                EventReason::StaleCreateFailed,
                format!("inspect interrupted create {}: {e}", vm.id),
            ));
        }
    };
    match reconcile::after_inspect(Ok(Some(&current.state))) {
        InspectVerdict::Drop => Ok(None),
        InspectVerdict::Keep => Ok(Some(current)),
        InspectVerdict::Orphan => {
            p.ports.runtime.remove(&current.id).await.map_err(|e| {
                Failure::transient(
                    EventReason::StaleCreateFailed,
                    format!("remove the dead record {} of an interrupted create: {e}", current.id),
                )
            })?;
            Ok(None)
        }
        InspectVerdict::Watch => Err(Failure::transient(
            EventReason::VmStillCreating,
            format!(
                "vm {} ({}) is still being created; retrying",
                current.name(),
                current.id
            ),
        )),
    }
}

/// The failure of a stale create that is not settled yet: still owned, or the verb failed.
fn still_creating_or_failed(vm: &VmRecord, outcome: &Result<StaleCreateOutcome, RuntimeError>) -> Failure {
    match outcome {
        Ok(other) => Failure::transient(
            EventReason::VmStillCreating,
            format!(
                "vm {} ({}) is still being created ({other:?}); retrying",
                vm.name(),
                vm.id
            ),
        ),
        Err(e) => Failure::transient(
            EventReason::StaleCreateFailed,
            format!("reconcile-stale-create {}: {e}", vm.id),
        ),
    }
}

/// Hibernate evidence: the registry's `<vm>:hibernate` tag, or a local snapshot when registry-less
/// — unless it holds the very guest this node already woke under that name (its snapshot id is
/// the one recorded at the wake): that guest lives on in a VM since, and the tag is a leftover,
/// no hibernated state.
pub(in crate::provider) async fn hibernate_evidence(p: &CocoonProvider, vm: &str) -> HibernateEvidence {
    let evidence = recorded_evidence(p, vm).await;
    let (HibernateEvidence::Found(_), Some(woken)) = (&evidence, p.state.woken_from(vm)) else {
        return evidence;
    };
    match saved_snapshot_id(p, vm).await {
        Ok(Some(id)) if id == woken => {
            tracing::info!(vm, snapshot = %id, "the hibernate snapshot of this vm name was already woken here: not hibernated state");
            HibernateEvidence::None
        }
        Ok(_) => evidence,
        Err(error) => HibernateEvidence::Unavailable(format!("which guest {vm}:hibernate holds: {error}")),
    }
}

/// The snapshot id the hibernated guest lives in: the `:hibernate` tag's (with a registry),
/// else the local snapshot's. `None` when there is none.
pub(in crate::provider) async fn saved_snapshot_id(
    p: &CocoonProvider,
    name: &str,
) -> Result<Option<String>, SavedSnapshotError> {
    match &p.ports.registry {
        Some(registry) => Ok(registry
            .snapshot_meta(name, plan::HIBERNATE_SNAPSHOT_TAG)
            .await?
            .map(|m| m.snapshot_id)),
        None => match p.ports.runtime.snapshot_inspect(name).await {
            Ok(s) => Ok(Some(s.id)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e.into()),
        },
    }
}

/// Why the id of the saved (hibernated) guest's snapshot cannot be read: the registry's answer
/// about the `:hibernate` tag, or cocoon's about the local snapshot. Either is inconclusive.
#[derive(Debug, thiserror::Error)]
pub(in crate::provider) enum SavedSnapshotError {
    #[error(transparent)]
    Registry(#[from] crate::registry::RegistryError),
    #[error(transparent)]
    Runtime(#[from] crate::runtime::RuntimeError),
}

async fn recorded_evidence(p: &CocoonProvider, vm: &str) -> HibernateEvidence {
    match &p.ports.registry {
        Some(registry) => {
            let lookup = registry.manifest(vm, plan::HIBERNATE_SNAPSHOT_TAG).await;
            plan::registry_evidence(lookup.as_ref().map(Option::as_ref))
        }
        // Registry-less, the evidence is a local snapshot of the VM's name, and it is always
        // asked, never taken from the kept list (`known`): cocoon has no event stream of
        // snapshots, so one brought here while the daemon runs (a hibernated guest moved
        // between registry-less nodes by `snapshot export` / `import`, the only way to move
        // one without a registry) would be missed, and a fresh boot over it would let the next
        // hibernate overwrite that guest's state. This lookup is the one a warm create makes.
        None => {
            let holder = p
                .state
                .holder_of(vm)
                .map(|(h, _)| format!("{}/{}", h.namespace, h.pod))
                .unwrap_or_default();
            plan::local_evidence(&p.ports.runtime.snapshot_inspect(vm).await, holder)
        }
    }
}

/// The bring-up policy's facts: the pod as decoded, what this node found (a VM of that name,
/// hibernate evidence, local snapshots), the node's settings, and the runtime values the pod
/// carries preassigned. One builder for CreatePod, the wake and the macOS path.
pub(in crate::provider) fn bring_up_facts(
    p: &CocoonProvider,
    pod: &Pod,
    facts: &PodFacts,
    spec: &VmSpec,
    vm_exists_locally: bool,
    evidence: HibernateEvidence,
    local_snapshots: Vec<LocalSnapshot>,
) -> bring_up::Facts {
    let preassigned = RuntimeAnnotations::of_pod(pod);
    let holders = super::super::ownership::bring_up_holders(p, &facts.key(), spec, &preassigned.vm_id, &preassigned.ip);
    bring_up::Facts {
        pod: facts.clone(),
        spec: spec.clone(),
        vm_exists_locally,
        evidence,
        registry_configured: p.ports.registry.is_some(),
        local_snapshots,
        node_restore_mode: p.cfg.restore_mode,
        preassigned_vm_id: preassigned.vm_id,
        preassigned_ip: preassigned.ip,
        preassigned_vnc_port: preassigned.vnc_port,
        previous_holder: holders.previous,
        fork_source_holder: holders.fork_source,
        image_holder: holders.image,
        preassigned_holder: holders.preassigned,
    }
}
