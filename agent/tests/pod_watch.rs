//! The pod watch against the real local cluster: a pod created after the watch started is named by its
//! UID, its IP and (through the real `/proc` and cgroup scan of the kubelet's containers) its network
//! namespace; after its deletion it is still named for events from before, by IP and namespace.

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use network_enforcer_agent::clock::monotonic_now;
use network_enforcer_agent::identity::attribution::{Attributor, Owner};
use network_enforcer_agent::identity::pod_identity::PodIdentities;
use network_enforcer_agent::identity::pod_watch;
use network_enforcer_agent::metrics::AgentMetrics;
use network_enforcer_tests::fixture::TestNamespace;
use network_enforcer_tests::images::TEST_IMAGE;
use std::net::IpAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(120);

fn label(owner: &Owner) -> Option<String> {
    match owner {
        Owner::Pod(p) => p.name.as_ref().map(|(ns, name)| format!("{ns}/{name}")),
        _ => None,
    }
}

#[tokio::test]
async fn the_watch_names_this_nodes_pods_and_remembers_deleted_ones() -> anyhow::Result<()> {
    let ns = TestNamespace::create("agent-pod-watch").await?;
    let nodes = Api::<Node>::all(ns.client.clone())
        .list(&ListParams::default())
        .await?;
    let node = nodes.items[0].metadata.name.clone().expect("node name");

    let attributor = Arc::new(Mutex::new(Attributor::new(Duration::from_secs(600))));
    let metrics = AgentMetrics::new();
    let watch = pod_watch::spawn(
        ns.client.clone(),
        node.clone(),
        attributor.clone(),
        metrics.pod_watch(),
    );
    ns.wait_for("the pod watch to sync", TIMEOUT, || async {
        Ok(attributor.lock().unwrap().watching().then_some(()))
    })
    .await?;

    // Created after the watch started.
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "named" },
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "main",
                "image": TEST_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
            }],
        },
    }))?;
    let pods = ns.api::<Pod>();
    let created = pods.create(&PostParams::default(), &pod).await?;
    let uid = created.metadata.uid.clone().expect("uid");
    let ip: IpAddr = ns
        .wait_for("the pod to run with an IP", TIMEOUT, || async {
            let pod = pods.get("named").await?;
            let status = pod.status.unwrap_or_default();
            let running = status.phase.as_deref() == Some("Running");
            Ok(status
                .pod_ip
                .filter(|_| running)
                .and_then(|ip| ip.parse().ok()))
        })
        .await?;
    let expected = format!("{}/named", ns.name);

    // By IP, from the watch.
    ns.wait_for("the watch to name the pod's IP", TIMEOUT, || async {
        let state = attributor.lock().unwrap();
        let owner = state.pod_by_ip(ip, monotonic_now()).map(Owner::Pod);
        Ok((owner.as_ref().and_then(label) == Some(expected.clone())).then_some(()))
    })
    .await?;

    // By network namespace, from the real /proc and cgroup tree of the kubelet's containers.
    let cgroup_root = network_enforcer_agent::kernel::host::cgroup2_root()?;
    let pod_netns = ns
        .wait_for(
            "a scan to find the pod's network namespace",
            TIMEOUT,
            || async {
                let ids = PodIdentities::scan(Path::new("/proc"), &cgroup_root)?;
                let found = ids
                    .netns_pods()
                    .find(|(_, u)| *u == uid)
                    .map(|(netns, _)| netns);
                if found.is_some() {
                    attributor.lock().unwrap().observe_scan(
                        ids.host_netns(),
                        ids.netns_pods(),
                        ids.cgroup_pods(),
                        monotonic_now(),
                    );
                }
                Ok(found)
            },
        )
        .await?;
    let before_delete = monotonic_now();
    {
        let state = attributor.lock().unwrap();
        let owner = state.resolve(Some(pod_netns), None, ip, before_delete);
        assert_eq!(label(&owner), Some(expected.clone()), "{owner:?}");
        let Owner::Pod(p) = owner else { unreachable!() };
        assert_eq!(&*p.uid, uid.as_str());
        assert!(!p.host_network);
    }

    // Deleted mid-flow: events from before are still named; the IP names nobody afterwards.
    pods.delete("named", &DeleteParams::default().grace_period(0))
        .await?;
    ns.wait_for("the watch to see the deletion", TIMEOUT, || async {
        Ok((attributor.lock().unwrap().stats().pods_deleted >= 1).then_some(()))
    })
    .await?;
    let state = attributor.lock().unwrap();
    assert_eq!(
        label(&state.resolve(Some(pod_netns), None, ip, before_delete)),
        Some(expected.clone())
    );
    assert_eq!(
        state
            .pod_by_ip(ip, before_delete)
            .as_ref()
            .map(|p| p.label()),
        Some(expected)
    );
    assert_eq!(
        state.pod_by_ip(ip, monotonic_now() + Duration::from_secs(1)),
        None,
        "after the deletion the IP is free"
    );
    drop(state);
    let text = metrics.encode();
    assert!(
        text.contains("network_enforcer_agent_pod_watch_events_total"),
        "{text}"
    );
    watch.abort();
    Ok(())
}
