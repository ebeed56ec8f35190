//! A bring-up (adopt the VM already here, else the path the policy picks) as a pipeline of typed
//! steps: [`gather`] reads what this node has for the pod (I/O), [`decide`] asks the bring-up
//! policy (pure, sandboxed; a create asks the translation policy for the plan's boot path in the
//! same hop), [`execute`] carries out the plan it chose (I/O). Each step fails with
//! its own [`BringUpError`] case, so the caller knows whether a failed bring-up was a restore (a
//! failed wake) without a flag threaded through every step. [`restore`] is the one restore of a
//! hibernated guest, shared by CreatePod and the UpdatePod wake.
//!
//! Nothing here imports `create` or `wake`: both import this.

mod execute;
mod gather;
mod restore;

pub(super) use execute::{adopted_finish, translate};
pub(super) use gather::{Ctx, SavedSnapshotError, bring_up_facts, hibernate_evidence, saved_snapshot_id};
pub(super) use restore::{restore, restore_finish};

use super::CocoonProvider;
use super::failure::Failure;
use super::guest::Finish;
use super::plan;
use crate::kubelet::EventReason;
use crate::policy::contract::bring_up::{Decision, Facts, Outcome};
use crate::policy::contract::resource_translation::BootPath;
use crate::policy::slots::{BringUp, ResourceTranslation};
use crate::runtime::VmRecord;
use gather::Lookup;
use tracing::Instrument as _;

/// A VM that is up, and what it still needs.
pub(super) struct BroughtUp {
    pub vm: VmRecord,
    /// Restored from hibernate (a wake through CreatePod).
    pub restoring: bool,
    /// An existing VM was adopted (nothing booted).
    pub adopted: bool,
    pub finish: Finish,
}

/// Which step of the pipeline failed, and why.
#[derive(Debug)]
pub(super) enum BringUpError {
    /// Reading what the node has: the VM table, cocoon, the stale-create settlement.
    Gather(Failure),
    /// The bring-up policy could not be asked, or refused.
    Decide(Failure),
    /// Carrying out a boot plan: images, snapshots, the clone or run verb.
    Execute(Failure),
    /// Restoring a hibernated guest (counted as a failed wake).
    Restore(Failure),
}

impl BringUpError {
    /// A restore failed: the pod was being woken.
    pub fn restoring(&self) -> bool {
        matches!(self, Self::Restore(_))
    }

    pub fn into_failure(self) -> Failure {
        match self {
            Self::Gather(f) | Self::Decide(f) | Self::Execute(f) | Self::Restore(f) => f,
        }
    }
}

/// Gather → decide → execute for a Linux guest, trusting the VM table for whether a VM of the
/// pod's name exists ([`Lookup::Table`]: no `vm inspect` on a create that succeeds). A bring-up
/// that fails asks cocoon: when a VM of the name exists after all (made behind the daemon's
/// back, or a stale create), the bring-up runs again knowing it, and adopts or settles it as
/// it would have with the lookup first. Nothing booted in between: every boot plan names the
/// VM, and cocoon refuses a second VM of a name.
pub(super) async fn bring_up(p: &CocoonProvider, ctx: &Ctx<'_>) -> Result<BroughtUp, BringUpError> {
    let failed = match attempt(p, ctx, Lookup::Table).await {
        Ok(up) => return Ok(up),
        Err(e) => e,
    };
    if !ctx.spec.managed || p.state.vm_by_name(&ctx.spec.vm_name).is_some() {
        return Err(failed);
    }
    match p.ports.runtime.inspect(&ctx.spec.vm_name).await {
        Ok(vm) => {
            tracing::info!(pod = %ctx.facts.key(), vm = %ctx.spec.vm_name, id = %vm.id, error = ?failed, "a vm of this name exists that the daemon did not know of: bringing up again with it");
            attempt(p, ctx, Lookup::Ask).await
        }
        Err(_) => Err(failed),
    }
}

async fn attempt(p: &CocoonProvider, ctx: &Ctx<'_>, lookup: Lookup) -> Result<BroughtUp, BringUpError> {
    let gathered = gather::gather(p, ctx, lookup)
        .instrument(tracing::debug_span!("bring_up.gather"))
        .await
        .map_err(BringUpError::Gather)?;
    let local_snapshots = gathered.local_snapshots();
    let facts = bring_up_facts(
        p,
        ctx.pod,
        &ctx.facts,
        &ctx.spec,
        gathered.existing.is_some(),
        gathered.evidence,
        local_snapshots,
    );
    let (decision, translation) = decide_with_translation(p, ctx, facts)
        .instrument(tracing::debug_span!("bring_up.decide"))
        .await
        .map_err(BringUpError::Decide)?;
    let plan = match decision.outcome {
        Outcome::Refuse(refusal) => {
            return Err(BringUpError::Decide(Failure::refused(refusal, decision.message)));
        }
        Outcome::Proceed(plan) => plan,
    };
    execute::execute(p, ctx, gathered.existing, gathered.image_snapshot, plan, translation)
        .instrument(tracing::debug_span!("bring_up.execute"))
        .await
}

/// The bring-up decision and, when its plan boots, the translation decision for the path it
/// boots by, in one hop to the blocking pool: a hop costs a thread wake-up (hundreds of
/// microseconds on a loaded machine), the second decision a few. The translation's facts are
/// the pod's and the path the plan picks (see [`execute::boot_path`]), so nothing between the
/// two decisions is missing; the execute step still takes its answer where it used to ask.
async fn decide_with_translation(
    p: &CocoonProvider,
    ctx: &Ctx<'_>,
    facts: Facts,
) -> Result<(Decision, Option<execute::Decided>), Failure> {
    let key = ctx.facts.key();
    let (uid, vm_name) = (facts.pod.uid.clone(), facts.spec.vm_name.clone());
    // Its path is the plan's, set once the plan is known.
    let mut translation_facts = execute::translation_facts(ctx, BootPath::Clone);
    let (decision, translation) = p
        .decide(move |pol| {
            let decision = pol.decide::<BringUp>(&facts);
            let translation = match &decision.outcome {
                Outcome::Proceed(plan) => execute::boot_path(plan).map(|path| {
                    translation_facts.path = path;
                    execute::Decided {
                        path,
                        decision: pol.decide::<ResourceTranslation>(&translation_facts),
                    }
                }),
                Outcome::Refuse(_) => None,
            };
            (decision, translation)
        })
        .await
        .map_err(|e| Failure::transient(EventReason::PolicyUnavailable, e.to_string()))?;
    let decision = settle(p, decision, &key, &uid, &vm_name, "bring-up decision")?;
    Ok((decision, translation))
}

/// Asks the bring-up policy (off the async workers), counts its hibernate-evidence verdict and
/// logs the decision under `what`. The one call of the slot for CreatePod, a wake and macOS: a
/// plan that proceeds takes the pod's VM name for it (refused when another live pod got it
/// meanwhile), so nothing is booted under a name the pod does not hold.
pub(super) async fn decide(p: &CocoonProvider, facts: Facts, key: &str, what: &str) -> Result<Decision, Failure> {
    let (uid, vm_name) = (facts.pod.uid.clone(), facts.spec.vm_name.clone());
    let decision = p
        .decide(move |pol| pol.decide::<BringUp>(&facts))
        .await
        .map_err(|e| Failure::transient(EventReason::PolicyUnavailable, e.to_string()))?;
    settle(p, decision, key, &uid, &vm_name, what)
}

/// What follows every bring-up decision: its evidence verdict counted, the decision logged
/// under `what`, and the VM name taken for a plan that proceeds.
fn settle(
    p: &CocoonProvider,
    decision: Decision,
    key: &str,
    uid: &str,
    vm_name: &str,
    what: &str,
) -> Result<Decision, Failure> {
    if let Some(verdict) = plan::evidence_verdict(&decision.outcome) {
        p.metrics.hibernate_evidence.with_label_values(&[verdict]).inc();
    }
    tracing::info!(pod = %key, reason = %decision.reason, message = %decision.message, "{what}");
    if matches!(decision.outcome, Outcome::Proceed(_)) {
        tracing::debug_span!("bring_up.take_name").in_scope(|| super::ownership::take_name(p, key, uid, vm_name))?;
    }
    Ok(decision)
}
