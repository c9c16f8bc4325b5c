//! Tests of the local cluster itself (docs/local-cluster.md): scheduling and pod networking, Services
//! over TCP and UDP through kube-proxy and cluster DNS (also headless Services), garbage collection,
//! CronJobs, pod cgroups, and the test image's echo server under load. Each test runs in its own
//! namespace on the shared cluster (started on first use; needs root and `cargo xtask setup`).

use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Endpoints, Pod, Service};
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use network_enforcer_tests::e2e::workload::echo_server_script;
use network_enforcer_tests::fixture::TestNamespace;
use network_enforcer_tests::images::{ECHO_SERVER, TEST_IMAGE};
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

/// Waits until pod `name` is Ready (its readiness probe passed) and returns its IP.
async fn ready_pod_ip(ns: &TestNamespace, name: &str) -> Result<String> {
    let pods = ns.api::<Pod>();
    ns.wait_for(&format!("pod {name} to be ready"), TIMEOUT, || async {
        let status = pods.get(name).await?.status.unwrap_or_default();
        let ready = status
            .conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        Ok(status.pod_ip.filter(|_| ready))
    })
    .await
}

/// Waits until pod `name` runs and returns its IP.
async fn running_pod_ip(ns: &TestNamespace, name: &str) -> Result<String> {
    let pods = ns.api::<Pod>();
    ns.wait_for(&format!("pod {name} to run"), TIMEOUT, || async {
        let status = pods.get(name).await?.status.unwrap_or_default();
        Ok(status
            .pod_ip
            .filter(|_| status.phase.as_deref() == Some("Running")))
    })
    .await
}

/// The A records busybox `nslookup` in pod `pod` gets for `name` (empty: no such name).
fn lookup(ns: &TestNamespace, pod: &str, name: &str) -> Result<BTreeSet<String>> {
    // nslookup exits non-zero for a name that does not exist: an answer here, not an error.
    let out = ns.kubectl(&[
        "exec",
        pod,
        "--",
        "sh",
        "-c",
        &format!("nslookup -type=a {name} 2>&1; true"),
    ])?;
    // "Server: / Address: <dns>:53", then a "Name: / Address: <ip>" pair per record.
    Ok(out
        .lines()
        .skip_while(|l| !l.starts_with("Name:"))
        .filter_map(|l| l.strip_prefix("Address:"))
        .map(|a| a.trim().to_string())
        .collect())
}

/// Waits until `name`, looked up from pod `pod`, has exactly the addresses `want`.
async fn wait_for_records(ns: &TestNamespace, pod: &str, name: &str, want: &[&str]) -> Result<()> {
    let want: BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
    let mut last = BTreeSet::new();
    ns.wait_for(&format!("{name} to resolve to {want:?}"), TIMEOUT, || {
        let done = lookup(ns, pod, name).map(|got| {
            let done = (got == want).then_some(());
            last = got;
            done
        });
        async move { done }
    })
    .await
    .with_context(|| format!("{name} resolved to {last:?} last"))
}

/// A StatefulSet behind a headless Service, the usual database shape, is reachable
/// by name. The Service's name resolves to its ready pods only (a pod turns ready when the test says
/// so), each pod also by `<pod>.<service>`, and a pod that goes away leaves the names.
#[tokio::test]
async fn headless_service_names_resolve_to_the_ready_pods_of_a_statefulset() -> Result<()> {
    let ns = TestNamespace::create("cluster-headless").await?;
    let service: Service = serde_json::from_value(json!({
        "metadata": { "name": "db" },
        "spec": {
            "clusterIP": "None",
            "selector": { "app": "db" },
            "ports": [{ "name": "db", "port": 5432, "protocol": "TCP" }],
        },
    }))?;
    ns.api::<Service>()
        .create(&PostParams::default(), &service)
        .await?;
    let statefulset: StatefulSet = serde_json::from_value(json!({
        "metadata": { "name": "db" },
        "spec": {
            "serviceName": "db",
            "replicas": 2,
            // Both pods at once: the test, not the controller, decides when each is ready.
            "podManagementPolicy": "Parallel",
            "selector": { "matchLabels": { "app": "db" } },
            "template": {
                "metadata": { "labels": { "app": "db" } },
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{
                        "name": "main",
                        "image": TEST_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": [ECHO_SERVER, "tcp:5432"],
                        "readinessProbe": {
                            "exec": { "command": ["test", "-e", "/tmp/ready"] },
                            "periodSeconds": 1,
                        },
                    }],
                },
            },
        },
    }))?;
    ns.api::<StatefulSet>()
        .create(&PostParams::default(), &statefulset)
        .await?;
    ns.api::<Pod>()
        .create(&PostParams::default(), &pod("client", "sleep 3600")?)
        .await?;
    running_pod_ip(&ns, "client").await?;
    let ip0 = running_pod_ip(&ns, "db-0").await?;
    let ip1 = running_pod_ip(&ns, "db-1").await?;

    let service_name = format!("db.{}.svc.cluster.local", ns.name);
    let pod0_name = format!("db-0.db.{}.svc.cluster.local", ns.name);
    let pod1_name = format!("db-1.db.{}.svc.cluster.local", ns.name);

    // Only db-0 ready: the name must settle on db-0 alone (a feeder that served not-ready addresses
    // never gets there).
    ns.kubectl(&["exec", "db-0", "--", "touch", "/tmp/ready"])?;
    ready_pod_ip(&ns, "db-0").await?;
    wait_for_records(&ns, "client", &service_name, &[&ip0]).await?;
    wait_for_records(&ns, "client", &pod0_name, &[&ip0]).await?;
    let pod1 = lookup(&ns, "client", &pod1_name)?;
    assert!(
        pod1.is_empty(),
        "{pod1_name} resolves to {pod1:?} while db-1 is not ready"
    );

    // Both ready: both addresses, each pod by its own name.
    ns.kubectl(&["exec", "db-1", "--", "touch", "/tmp/ready"])?;
    ready_pod_ip(&ns, "db-1").await?;
    wait_for_records(&ns, "client", &service_name, &[&ip0, &ip1]).await?;
    wait_for_records(&ns, "client", &pod1_name, &[&ip1]).await?;

    // A connection by the pod's name, fully qualified and through the search path (as apps configure
    // it), reaches that pod.
    for host in [pod0_name.as_str(), "db-1.db"] {
        let reply = ns.kubectl(&[
            "exec",
            "client",
            "--",
            "sh",
            "-c",
            &format!("echo hello-{host} | socat -t 3 - TCP:{host}:5432,connect-timeout=3"),
        ])?;
        assert_eq!(reply.trim(), format!("hello-{host}"), "TCP to {host}:5432");
    }

    // db-1 goes away: its names go with it.
    ns.api::<StatefulSet>()
        .patch(
            "db",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "replicas": 1 } })),
        )
        .await?;
    wait_for_records(&ns, "client", &service_name, &[&ip0]).await?;
    wait_for_records(&ns, "client", &pod1_name, &[]).await?;
    Ok(())
}

/// The e2e tests' echo server (as `echo_server_script` starts it) answers every
/// one of 200 clients per port that all start at once, over TCP (each half-closes right after its
/// payload) and UDP, each client with its own payload.
#[tokio::test]
async fn the_echo_server_answers_every_one_of_200_parallel_tcp_and_udp_clients() -> Result<()> {
    let ns = TestNamespace::create("cluster-echo").await?;
    // The e2e workload's ports.
    let server: Pod = serde_json::from_value(json!({
        "metadata": { "name": "echo" },
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "main",
                "image": TEST_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", echo_server_script(&[18080, 18082], &[18081])],
                // Ready once it accepts: the clients must not race the server's start.
                "readinessProbe": { "tcpSocket": { "port": 18082 }, "periodSeconds": 1 },
            }],
        },
    }))?;
    ns.api::<Pod>()
        .create(&PostParams::default(), &server)
        .await?;
    let ip = ready_pod_ip(&ns, "echo").await?;

    let check = format!("{ECHO_SERVER} --check {ip} 200 tcp:18080 tcp:18082 udp:18081");
    ns.api::<Pod>()
        .create(&PostParams::default(), &pod("load", &check)?)
        .await?;
    let log = ns
        .wait_for_pod_success("load", TIMEOUT)
        .await
        .context("some clients did not get their payload back")?;
    for port in ["tcp:18080", "tcp:18082", "udp:18081"] {
        assert!(
            log.contains(&format!("{port} 200/200 echoed")),
            "no full echo on {port}:\n{log}"
        );
    }
    Ok(())
}
