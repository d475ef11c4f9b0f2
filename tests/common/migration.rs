//! The migration a user makes from flanneld to twill, node by node: kube-flannel.yml runs
//! flanneld v0.28.9's own image, then its image lines are changed to twill's and applied again,
//! and the DaemonSet's rolling update replaces flanneld with twill one node at a time, while
//! pods on the two nodes ping each other every 10 ms. Halfway, one node runs twill and the
//! other flanneld: that mixed cluster is checked as such.

use super::flannel_e2e::{rules_are_flanneld_s, uninstall, PingLoss, MEASURE_AFTER};
use super::kube_flannel::{rolls_out, Variant, POD_TIMEOUT, ROLLOUT_TIMEOUT};
use super::pod_traffic::{pods_talk_across_nodes, PingersBothWays, TestPods};
use anyhow::{ensure, Context, Result};
use twill_lab::{Cluster, Image};

/// How long each node's new pod must stay Ready before the rolling update moves to the next
/// node (the DaemonSet's minReadySeconds, as a careful user sets it): the mixed cluster lasts
/// at least this long, long enough for its checks.
const MIXED_WINDOW: u32 = 15;

/// kube-flannel.yml on `backend` with flanneld's image, then with twill's applied over it: the
/// rules on each node are flanneld's before and after; in the mixed cluster the pods ping both
/// ways and carry TCP intact; what the pings lost across the whole update.
pub fn migrate(
    cluster: &mut Cluster,
    flanneld: &Image,
    twill: &Image,
    backend: &'static str,
) -> Result<PingLoss> {
    let variant = Variant {
        min_ready_seconds: MIXED_WINDOW,
        ..Variant::new(backend)
    };
    let mut run =
        || -> Result<PingLoss> {
            let before = variant.manifest(flanneld)?;
            rolls_out(cluster, &before, flanneld)?;
            // flanneld's own rules on this cluster are the recorded ones: the check below means
            // what it says.
            rules_are_flanneld_s(cluster, &variant)?;
            let pods = TestPods::start(cluster)?;
            pods_talk_across_nodes(cluster, &pods)?;

            let pingers = PingersBothWays::start(&pods);
            let after = variant.manifest(twill)?;
            cluster.api().apply_yaml(&after.text)?;
            let flanneld_pod = wait_mixed(cluster, after.namespace, flanneld, twill)?;
            let checking = std::time::Instant::now();
            pods_talk_across_nodes(cluster, &pods).context("in the mixed cluster")?;
            rules_are_flanneld_s(cluster, &variant).context("in the mixed cluster")?;
            ensure!(
            still_runs(cluster, after.namespace, &flanneld_pod)?,
            "flanneld's pod {flanneld_pod} was replaced before the mixed cluster's checks ended \
             (they took {:?}; the pings lost {})",
            checking.elapsed(),
            PingLoss { ways: pingers.finish()? }
        );
            cluster.wait_daemonset(after.namespace, after.daemonset, ROLLOUT_TIMEOUT)?;
            pods_talk_across_nodes(cluster, &pods)?;
            std::thread::sleep(MEASURE_AFTER);
            let ways = pingers.finish()?;
            rules_are_flanneld_s(cluster, &variant)?;
            pods.delete(cluster)?;
            uninstall(cluster, &after)?;
            Ok(PingLoss { ways })
        };
    run().with_context(|| format!("migrating {backend} from flanneld to twill"))
}

/// Waits until one node's DaemonSet pod runs `twill` and is Ready while the other's still
/// runs `flanneld`; the flanneld pod's name.
fn wait_mixed(
    cluster: &mut Cluster,
    namespace: &str,
    flanneld: &Image,
    twill: &Image,
) -> Result<String> {
    let what = "one node on twill (Ready), the other still on flanneld";
    cluster.wait_for(what, POD_TIMEOUT, |c| {
        let (mut on_twill, mut on_flanneld) = (None, None);
        for name in c.pods(namespace)? {
            let pod = c.pod(namespace, &name)?;
            let terminating = pod.metadata.deletion_timestamp.is_some();
            let status = pod.status.unwrap_or_default();
            let Some(container) = status.container_statuses.into_iter().flatten().next() else {
                continue;
            };
            if container.image == twill.name && container.ready {
                on_twill = Some(name);
            } else if container.image == flanneld.name && !terminating {
                on_flanneld = Some(name);
            }
        }
        Ok(on_twill.and(on_flanneld))
    })
}

/// Whether pod `name` exists and is not being deleted.
fn still_runs(cluster: &Cluster, namespace: &str, name: &str) -> Result<bool> {
    if !cluster.pods(namespace)?.iter().any(|p| p == name) {
        return Ok(false);
    }
    let pod = cluster.pod(namespace, name)?;
    Ok(pod.metadata.deletion_timestamp.is_none())
}
