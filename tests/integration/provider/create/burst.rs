//! A burst of creates on one node: their bring-ups overlap up to `VK_MAX_CONCURRENT_BRING_UPS`
//! and never beyond (the simulator's call log says how many `vm clone` ran at once), the others
//! wait their turn (the wait is counted), and every pod comes up.

use super::wait_ready;
use crate::provider_support::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_burst_larger_than_the_bound_never_clones_more_than_the_bound_at_once_and_every_pod_comes_up() {
    const BOUND: usize = 2;
    const PODS: usize = 7;
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    // Each clone takes long enough for the burst to pile up behind the bound (the pod
    // controller of these tests runs 4 operations at once, more than the bound).
    env.sim.set_settings(|s| s.create_delay_ms = 400).unwrap();
    let d = start(
        &env,
        Options {
            max_bring_ups: BOUND,
            ..Options::default()
        },
    );
    let pods: Vec<_> = (0..PODS)
        .map(|i| {
            managed(
                &format!("burst-{i}"),
                &format!("vm-burst-{i}"),
                &[("cocoonset.cocoonstack.io/image", "base")],
            )
        })
        .collect();
    futures::future::join_all(pods.iter().map(|p| create(&env, p))).await;
    for i in 0..PODS {
        wait_ready(&env, &format!("burst-{i}")).await;
    }

    assert_eq!(calls(&env, "vm clone").len(), PODS);
    // Up to the bound at once (the creates overlap), never more.
    assert_eq!(env.sim.most_at_once("vm clone").unwrap(), BOUND);
    let metrics = d.provider.metrics();
    assert_eq!(metrics.bring_up_wait_duration.get_sample_count(), PODS as u64);
    // Some waited for a turn at least a whole clone.
    assert!(
        metrics.bring_up_wait_duration.get_sample_sum() >= 0.4,
        "waited {} s in all",
        metrics.bring_up_wait_duration.get_sample_sum()
    );
    assert_eq!(
        (metrics.bring_ups_waiting.get(), metrics.bring_ups_running.get()),
        (0, 0)
    );
    d.kill().await;
}
