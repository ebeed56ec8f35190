//! The retry owed to a failed hibernate or wake: what the pod controller does next once a
//! transition ended, and the schedule of its retries. UpdatePod, its requeue hook, CreatePod's
//! adoption of a pod that wants to hibernate and the startup's resumed hibernates all end a
//! transition here, so the rule "a failure owes a retry, a success or a permanent refusal
//! settles it" has one owner below every operation that needs it.

use k8s_openapi::api::core::v1::Pod;

use super::CocoonProvider;
use super::hibernate;
use crate::kubelet::Next;
use crate::policy::contract::types::RefusalKind;
use crate::retry::Schedule;

/// Hibernates now, or owes a retry when that fails (resume after restart, CreatePod adoption):
/// what the pod controller should do next.
pub(super) async fn hibernate_or_owe(p: &CocoonProvider, pod: &Pod, key: &str) -> Next {
    let uid = super::table::uid_of(pod);
    let _op = p.state.lock_op(key).await;
    let result = hibernate::hibernate(p, pod, key)
        .await
        .then_some(())
        .ok_or(RefusalKind::RetryLater);
    after_transition(p, key, &uid, result)
}

/// After a hibernate or wake: nothing owed once it worked; when it failed, the retry its
/// kind says (backoff, the slowest pace while an operator must act, none when only a
/// change of the pod can help), for the pod controller to schedule. The status is
/// republished either way.
pub(super) fn after_transition(p: &CocoonProvider, key: &str, uid: &str, result: Result<(), RefusalKind>) -> Next {
    let next = match result {
        Ok(()) | Err(RefusalKind::Permanent) => {
            p.state.settle_retry(key, uid);
            Next::Done
        }
        Err(kind) => {
            let schedule = op_retry_schedule(&p.cfg.timings, kind);
            p.state.owe_retry(key, uid, schedule);
            tracing::info!(pod = %key, ?kind, "hibernate/wake failed; retry owed");
            Next::Requeue(schedule)
        }
    };
    p.notify(key);
    next
}

/// The schedule of a failed transition's retries (`DECISIONS.md` row 10), `max(min,
/// min(prev·2, max))` exactly, no jitter: a failed transition is retried no sooner than the
/// lifecycle's own delays (15 s, 30 s, 1 min, … 5 min), the way the operator expects it;
/// failures of many pods are spread by when each failed. Waiting for an operator is re-checked
/// at the slowest pace, the cap.
fn op_retry_schedule(t: &super::Timings, kind: RefusalKind) -> Schedule {
    match kind {
        RefusalKind::NeedsOperator => Schedule::every(t.op_retry_max),
        RefusalKind::RetryLater | RefusalKind::Permanent => Schedule::backoff(t.op_retry_min, t.op_retry_max).exact(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_transition_is_retried_at_15_s_doubling_to_5_min_never_sooner() {
        let t = super::super::Timings::default();
        let secs: Vec<u64> = op_retry_schedule(&t, RefusalKind::RetryLater)
            .delays()
            .take(8)
            .map(|d| d.as_secs())
            .collect();
        assert_eq!(secs, [15, 30, 60, 120, 240, 300, 300, 300]);
        let operator: Vec<u64> = op_retry_schedule(&t, RefusalKind::NeedsOperator)
            .delays()
            .take(2)
            .map(|d| d.as_secs())
            .collect();
        assert_eq!(operator, [300, 300]);
    }
}
