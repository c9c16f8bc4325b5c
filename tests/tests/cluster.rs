//! Tests of the local cluster itself (issue 3): scheduling and pod networking, Services over TCP and
//! UDP through kube-proxy and cluster DNS, garbage collection, CronJobs, and pod cgroups. Each test
//! runs in its own namespace on the shared cluster (started on first use; needs root and
//! `cargo xtask setup`).

use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Endpoints, Pod, Service};
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};
use network_enforcer_tests::fixture::TestNamespace;
use network_enforcer_tests::images::TEST_IMAGE;
use serde_json::json;
use std::collections::BTreeSet;
use std::time::Duration;

/// Generous: the machine has two cores shared with builds.
const TIMEOUT: Duration = Duration::from_secs(120);

/// A Deployment of the test image running `script`, with `replicas` pods labelled `app: <name>`.
fn deployment(name: &str, replicas: i32, script: &str) -> Result<Deployment> {
    Ok(serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": { "app": name } },
            "template": {
                "metadata": { "labels": { "app": name } },
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{
                        "name": "main",
                        "image": TEST_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["sh", "-c", script],
                    }],
                },
            },
        },
    }))?)
}

/// A run-once pod of the test image running `script`.
fn pod(name: &str, script: &str) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "main",
                "image": TEST_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
            }],
        },
    }))?)
}

/// Waits until `count` pods labelled `app=<app>` run and have IPs; returns (name, IP) pairs.
async fn running_pods(
    ns: &TestNamespace,
    app: &str,
    count: usize,
) -> Result<Vec<(String, String)>> {
    ns.wait_for(
        &format!("{count} running pods of {app}"),
        TIMEOUT,
        || async {
            let pods = ns.pods(&format!("app={app}")).await?;
            let running: Vec<(String, String)> = pods
                .iter()
                .filter_map(|p| {
                    let status = p.status.as_ref()?;
                    (status.phase.as_deref() == Some("Running"))
                        .then(|| Some((p.metadata.name.clone()?, status.pod_ip.clone()?)))?
                })
                .collect();
            Ok((running.len() == count && pods.len() == count).then_some(running))
        },
    )
    .await
}

#[tokio::test]
async fn deployment_pods_run_with_ips_and_serve_tcp_and_udp_by_service_name() -> Result<()> {
    let ns = TestNamespace::create("cluster-service").await?;
    // Each answer names the pod that gave it, so the client can tell the backends apart.
    let server = "socat TCP-LISTEN:8080,fork,reuseaddr SYSTEM:'echo tcp $HOSTNAME' & \
                  socat UDP-RECVFROM:9090,fork SYSTEM:'echo udp $HOSTNAME' & wait";
    ns.api::<Deployment>()
        .create(&PostParams::default(), &deployment("echo", 2, server)?)
        .await?;
    let service: Service = serde_json::from_value(json!({
        "metadata": { "name": "echo" },
        "spec": {
            "selector": { "app": "echo" },
            "ports": [
                { "name": "tcp", "port": 80, "targetPort": 8080, "protocol": "TCP" },
                { "name": "udp", "port": 53, "targetPort": 9090, "protocol": "UDP" },
            ],
        },
    }))?;
    ns.api::<Service>()
        .create(&PostParams::default(), &service)
        .await?;

    let backends = running_pods(&ns, "echo", 2).await?;
    let names: BTreeSet<String> = backends.iter().map(|(n, _)| n.clone()).collect();
    for (name, ip) in &backends {
        assert!(
            ip.starts_with("10.244.0."),
            "pod {name} has IP {ip}, outside the pod range"
        );
    }

    // Both backends behind the Service before the client starts, so that its connections can spread.
    let endpoints = ns.api::<Endpoints>();
    ns.wait_for("2 endpoints behind Service echo", TIMEOUT, || async {
        let ready = endpoints
            .get_opt("echo")
            .await?
            .and_then(|e| e.subsets)
            .unwrap_or_default()
            .iter()
            .map(|s| s.addresses.as_ref().map_or(0, Vec::len))
            .sum::<usize>();
        Ok((ready == 2).then_some(()))
    })
    .await?;

    // By Service name (cluster DNS), to the ClusterIP port (kube-proxy DNAT to the target port).
    // Retries cover the moment before DNS and the endpoints know the Service.
    let client = r#"
        for i in $(seq 1 60); do socat -t 2 - TCP:echo:80 </dev/null && break; sleep 1; done
        for i in $(seq 1 60); do socat -t 2 - TCP:echo:80 </dev/null; sleep 0.2; done
        for i in $(seq 1 10); do echo ping | socat -t 2 - UDP:echo:53; done
    "#;
    ns.api::<Pod>()
        .create(&PostParams::default(), &pod("client", client)?)
        .await?;
    let log = ns.wait_for_pod_success("client", TIMEOUT).await?;

    let answered = |proto: &str| -> BTreeSet<String> {
        log.lines()
            .filter_map(|l| l.strip_prefix(&format!("{proto} ")))
            .map(|s| s.trim().to_string())
            .collect()
    };
    let tcp = answered("tcp");
    let udp = answered("udp");
    // 61 TCP connections over ~15 s spread by kube-proxy's random choice: both backends answer (a miss
    // would be a 2^-60 chance once kube-proxy has programmed both; the spread in time covers kube-proxy
    // programming the second endpoint a little after the Endpoints object lists it).
    assert_eq!(
        tcp, names,
        "TCP answers came from {tcp:?}, backends are {names:?}; log:\n{log}"
    );
    assert!(
        !udp.is_empty() && udp.is_subset(&names),
        "UDP answers {udp:?}, backends {names:?}; log:\n{log}"
    );
    Ok(())
}

#[tokio::test]
async fn deleting_a_deployment_garbage_collects_its_replicaset_and_pods() -> Result<()> {
    let ns = TestNamespace::create("cluster-gc").await?;
    let deployments = ns.api::<Deployment>();
    deployments
        .create(
            &PostParams::default(),
            &deployment("sleeper", 2, "sleep 3600")?,
        )
        .await?;
    running_pods(&ns, "sleeper", 2).await?;
    let replicasets = ns.api::<ReplicaSet>();
    let owned = replicasets.list(&Default::default()).await?.items;
    assert_eq!(owned.len(), 1, "one ReplicaSet for the Deployment");
    let owner = owned[0]
        .metadata
        .owner_references
        .clone()
        .unwrap_or_default();
    assert!(
        owner
            .iter()
            .any(|o| o.kind == "Deployment" && o.name == "sleeper"),
        "the ReplicaSet is owned by the Deployment: {owner:?}"
    );

    deployments
        .delete("sleeper", &DeleteParams::background())
        .await?;
    ns.wait_for(
        "the ReplicaSet and pods to be garbage-collected",
        TIMEOUT,
        || async {
            let rs = replicasets.list(&Default::default()).await?.items.len();
            let pods = ns.pods("app=sleeper").await?.len();
            Ok((rs == 0 && pods == 0).then_some(()))
        },
    )
    .await
}

#[tokio::test]
async fn a_cronjob_run_creates_a_job_and_a_pod() -> Result<()> {
    let ns = TestNamespace::create("cluster-cron").await?;
    // v1.20 serves CronJob only as batch/v1beta1 (k8s-openapi has batch/v1): a dynamic object.
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("batch", "v1beta1", "CronJob"),
        "cronjobs",
    );
    let cronjobs: kube::Api<DynamicObject> =
        kube::Api::namespaced_with(ns.client.clone(), &ns.name, &resource);
    let cronjob: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "batch/v1beta1",
        "kind": "CronJob",
        "metadata": { "name": "tick" },
        "spec": {
            "schedule": "* * * * *",
            "jobTemplate": { "spec": { "template": { "spec": {
                "restartPolicy": "Never",
                "containers": [{
                    "name": "main",
                    "image": TEST_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "echo tick"],
                }],
            }}}},
        },
    }))?;
    cronjobs.create(&PostParams::default(), &cronjob).await?;

    // The schedule fires at the next minute boundary; the controller checks every 10 s.
    let jobs = ns.api::<Job>();
    let job = ns
        .wait_for(
            "the CronJob to create a Job",
            Duration::from_secs(150),
            || async {
                let list = jobs.list(&Default::default()).await?.items;
                Ok(list.into_iter().find(|j| {
                    j.metadata
                        .owner_references
                        .as_ref()
                        .is_some_and(|o| o.iter().any(|o| o.kind == "CronJob" && o.name == "tick"))
                }))
            },
        )
        .await?;
    let job_name = job.metadata.name.context("job without name")?;
    let pod = ns
        .wait_for("the Job's pod to succeed", TIMEOUT, || async {
            let pods = ns.pods(&format!("job-name={job_name}")).await?;
            Ok(pods
                .into_iter()
                .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded")))
        })
        .await?;
    let log = ns
        .api::<Pod>()
        .logs(
            pod.metadata.name.as_deref().unwrap_or_default(),
            &Default::default(),
        )
        .await?;
    assert_eq!(log.trim(), "tick");
    Ok(())
}

#[tokio::test]
async fn pod_cgroup_paths_contain_the_pod_uid() -> Result<()> {
    let ns = TestNamespace::create("cluster-cgroup").await?;
    // Through kubectl, to exercise the fixture's manifest path as well.
    ns.apply(&serde_json::to_string(&pod("sleeper", "sleep 3600")?)?)?;
    let uid = ns
        .wait_for("the pod to run", TIMEOUT, || async {
            let pod = ns.api::<Pod>().get("sleeper").await?;
            let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            Ok(running.then(|| pod.metadata.uid.clone()).flatten())
        })
        .await?;

    // cgroupfs driver on a hybrid v1 + v2 host: /sys/fs/cgroup/<hierarchy>/kubepods/<qos>/pod<UID>/<id>.
    let mut found = Vec::new();
    for hierarchy in ["memory", "pids", "unified"] {
        let root = std::path::Path::new("/sys/fs/cgroup")
            .join(hierarchy)
            .join("kubepods");
        let dir = find_dir(&root, &format!("pod{uid}"))
            .with_context(|| format!("no pod{uid} cgroup under {}", root.display()))?;
        found.push(dir);
    }
    // And the container's processes are in it: some task's /proc/<pid>/cgroup names the pod.
    let unified = &found[2];
    let pid = std::fs::read_dir(unified)?
        .flatten()
        .filter(|e| e.path().is_dir())
        .find_map(|e| {
            std::fs::read_to_string(e.path().join("cgroup.procs"))
                .ok()?
                .lines()
                .next()
                .map(str::to_string)
        })
        .with_context(|| format!("no process in the containers of {}", unified.display()))?;
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
    if !cgroup.contains(&format!("pod{uid}")) {
        bail!("/proc/{pid}/cgroup does not name pod {uid}:\n{cgroup}");
    }
    Ok(())
}

/// The first directory named `name` below `root`.
fn find_dir(root: &std::path::Path, name: &str) -> Option<std::path::PathBuf> {
    for entry in std::fs::read_dir(root).ok()?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if entry.file_name() == name {
                return Some(path);
            }
            if let Some(found) = find_dir(&path, name) {
                return Some(found);
            }
        }
    }
    None
}

#[tokio::test]
async fn pods_reach_the_api_server_through_the_kubernetes_service_with_their_token() -> Result<()> {
    let ns = TestNamespace::create("cluster-api").await?;
    // TLS to `kubernetes.default.svc` (cluster DNS, ClusterIP DNAT to the advertised node address),
    // the server certificate checked against the mounted CA, the ServiceAccount token accepted.
    // Retries: the API server authenticates a token only once its own cache has the token's brand-new
    // Secret (a second or so after the namespace was created: 401 until then).
    let client = r#"
        sa=/var/run/secrets/kubernetes.io/serviceaccount
        for i in $(seq 1 30); do
          printf 'GET /apis/authentication.k8s.io/v1 HTTP/1.0\r\nHost: kubernetes\r\nAuthorization: Bearer %s\r\n\r\n' "$(cat $sa/token)" \
            | socat -t 5 - OPENSSL:kubernetes.default.svc:443,cafile=$sa/ca.crt > response
          head -1 response | grep -q ' 200 ' && break
          sleep 1
        done
        cat response
    "#;
    ns.api::<Pod>()
        .create(&PostParams::default(), &pod("api-client", client)?)
        .await?;
    let log = ns.wait_for_pod_success("api-client", TIMEOUT).await?;
    // An anonymous or rejected token gets 401; the discovery document needs an authenticated user.
    assert!(
        log.starts_with("HTTP/1.1 200") || log.starts_with("HTTP/1.0 200"),
        "expected 200 from the API server, got:\n{log}"
    );
    assert!(log.contains("tokenreviews"), "unexpected body:\n{log}");
    Ok(())
}
