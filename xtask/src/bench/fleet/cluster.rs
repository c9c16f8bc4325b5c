//! The fleet: Nodes, agent pods with tokens, apps.

use super::*;

fn pod_ip(index: usize) -> Ipv4Addr {
    // 100.64.0.0/10 (shared address space): clear of the cluster's pod and service ranges.
    Ipv4Addr::from(u32::from(Ipv4Addr::new(100, 64, 0, 1)) + index as u32)
}

/// Creates `items` with at most [`CONCURRENCY`] requests in flight; fails with the first error.
async fn in_parallel<T, F, Fut, O>(items: Vec<T>, f: F) -> Result<Vec<O>>
where
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = Result<O>>,
{
    let results: Vec<Result<O>> = futures::stream::iter(items.into_iter().map(f))
        .buffered(CONCURRENCY)
        .collect()
        .await;
    results.into_iter().collect()
}

fn tolerations() -> serde_json::Value {
    json!([
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
        {"key": NODE_LABEL, "operator": "Exists"}
    ])
}

impl Fleet {
    pub(super) async fn create(client: &Client, settings: &Settings) -> Result<Self> {
        let pid = std::process::id();
        let n = settings.max_agents();
        let apps_ns = TestNamespace::create_with_crds("fleet-apps").await?;
        let agents_ns = TestNamespace::create("fleet-agents").await?;
        let mut fleet = Fleet {
            client: client.clone(),
            apps_ns,
            agents_ns,
            agents: Vec::new(),
            pod_ips: Arc::default(),
            services: Arc::default(),
        };
        // From here on, a failure still deletes what was made.
        if let Err(e) = fleet.populate(settings, pid, n).await {
            fleet.delete().await;
            return Err(e);
        }
        Ok(fleet)
    }

    async fn populate(&mut self, settings: &Settings, pid: u32, n: usize) -> Result<()> {
        let nodes: Vec<String> = (0..n).map(|i| format!("fleet-{pid}-{i}")).collect();
        let t = Instant::now();
        let node_api = Api::<Node>::all(self.client.clone());
        in_parallel(nodes.clone(), |name| {
            let api = node_api.clone();
            async move {
                let node: Node = serde_json::from_value(json!({
                    "metadata": {"name": name, "labels": {NODE_LABEL: pid.to_string()}},
                    "spec": {"unschedulable": true,
                             "taints": [{"key": NODE_LABEL, "effect": "NoSchedule"}]}
                }))?;
                api.create(&PostParams::default(), &node).await?;
                Ok(())
            }
        })
        .await
        .context("creating Nodes")?;
        println!("    {n} Nodes in {:.1}s", t.elapsed().as_secs_f64());

        // Apps: a ReplicaSet each (its template names a ServiceAccount that does not exist, so the
        // ReplicaSet controller cannot add pods of its own) and a Service.
        let apps = settings.apps;
        let ppn = settings.pods_per_node;
        let total_pods = n * ppn;
        let app_ns = self.apps_ns.name.clone();
        let rs_api = self.apps_ns.api::<ReplicaSet>();
        let svc_api = self.apps_ns.api::<Service>();
        let sets = in_parallel((0..apps).collect(), |k| {
            let (rs_api, svc_api) = (rs_api.clone(), svc_api.clone());
            let replicas = (0..total_pods).filter(|p| p % apps == k).count();
            async move {
                let labels = json!({"app": format!("app-{k}"), "pod-template-hash": HASH});
                let rs: ReplicaSet = serde_json::from_value(json!({
                    "metadata": {"name": format!("app-{k}-{HASH}"), "labels": labels},
                    "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                        "template": {"metadata": {"labels": labels}, "spec": {
                            "serviceAccountName": "fleet-does-not-exist",
                            "automountServiceAccountToken": false,
                            "containers": [{"name": "main", "image": "fleet.invalid/none:0",
                                "ports": [{"name": "http", "containerPort": 8000 + k}]}]}}}
                }))?;
                let rs = rs_api.create(&PostParams::default(), &rs).await?;
                let svc: Service = serde_json::from_value(json!({
                    "metadata": {"name": format!("app-{k}")},
                    "spec": {"selector": {"app": format!("app-{k}")},
                             "ports": [{"name": "http", "port": 80, "targetPort": 8000 + k}]}
                }))?;
                let svc = svc_api.create(&PostParams::default(), &svc).await?;
                let ip: Ipv4Addr = svc
                    .spec
                    .and_then(|s| s.cluster_ip)
                    .context("Service without ClusterIP")?
                    .parse()?;
                Ok((rs.uid().context("ReplicaSet without uid")?, ip))
            }
        })
        .await
        .context("creating apps")?;
        self.services = Arc::new(sets.iter().map(|(_, ip)| *ip).collect());

        let t = Instant::now();
        let pod_api = self.apps_ns.api::<Pod>();
        let workload_pods: Vec<(usize, usize)> =
            (0..n).flat_map(|i| (0..ppn).map(move |j| (i, j))).collect();
        let created = in_parallel(workload_pods, |(i, j)| {
            let api = pod_api.clone();
            let p = i * ppn + j;
            let k = p % apps;
            let node = nodes[i].clone();
            let rs_uid = sets[k].0.clone();
            let app_ns = app_ns.clone();
            async move {
                let name = format!("app-{k}-{HASH}-n{i}p{j}");
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": {"name": name,
                        "labels": {"app": format!("app-{k}"), "pod-template-hash": HASH},
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                            "name": format!("app-{k}-{HASH}"), "uid": rs_uid, "controller": true}]},
                    "spec": {"nodeName": node, "automountServiceAccountToken": false,
                        "terminationGracePeriodSeconds": 0, "tolerations": tolerations(),
                        "containers": [{"name": "main", "image": "fleet.invalid/none:0",
                            "ports": [{"name": "http", "containerPort": 8000 + k}]}]}
                }))?;
                let pod = api.create(&PostParams::default(), &pod).await?;
                let ip = pod_ip(p).to_string();
                let status = json!({"status": {"phase": "Running", "podIP": ip,
                    "podIPs": [{"ip": ip}]}});
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                    .await?;
                let local = LocalPod {
                    namespace: app_ns,
                    name,
                    uid: pod.uid().unwrap_or_default(),
                };
                Ok((i, local, k))
            }
        })
        .await
        .context("creating workload pods")?;
        println!(
            "    {} workload pods with IPs in {:.1}s",
            n * ppn,
            t.elapsed().as_secs_f64()
        );
        self.pod_ips = Arc::new((0..n * ppn).map(|p| (pod_ip(p), p % apps)).collect());

        let t = Instant::now();
        let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": AGENT_SA}}))?;
        self.agents_ns
            .api::<ServiceAccount>()
            .create(&PostParams::default(), &sa)
            .await?;
        let agent_pods = self.agents_ns.api::<Pod>();
        let accounts = self.agents_ns.api::<ServiceAccount>();
        let tokens = in_parallel((0..n).collect(), |i| {
            let (pods, accounts) = (agent_pods.clone(), accounts.clone());
            let node = nodes[i].clone();
            async move {
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": {"name": format!("agent-{i}"), "labels": {"app": "fleet-agent"}},
                    "spec": {"nodeName": node, "serviceAccountName": AGENT_SA,
                        "automountServiceAccountToken": false, "terminationGracePeriodSeconds": 0,
                        "tolerations": tolerations(),
                        "containers": [{"name": "agent", "image": "fleet.invalid/none:0"}]}
                }))?;
                let pod = pods.create(&PostParams::default(), &pod).await?;
                let request: TokenRequest = serde_json::from_value(json!({"spec": {
                    "audiences": [AUDIENCE], "expirationSeconds": 3600,
                    "boundObjectRef": {"apiVersion": "v1", "kind": "Pod",
                        "name": pod.name_any(), "uid": pod.uid()}}}))?;
                let token = accounts
                    .create_token_request(AGENT_SA, &PostParams::default(), &request)
                    .await?
                    .status
                    .and_then(|s| s.token)
                    .context("the API server issued no token")?;
                Ok(token)
            }
        })
        .await
        .context("creating agent pods and tokens")?;
        println!(
            "    {n} agent pods and tokens in {:.1}s",
            t.elapsed().as_secs_f64()
        );
        let mut agents: Vec<AgentSpec> = nodes
            .into_iter()
            .zip(tokens)
            .map(|(node, token)| AgentSpec {
                node,
                token,
                pods: Vec::new(),
            })
            .collect();
        for (i, local, k) in created {
            agents[i].pods.push((local, k));
        }
        self.agents = agents;
        Ok(())
    }

    /// Deletes the pods (at once: no kubelet confirms), the apps, the Nodes and both namespaces.
    pub(super) async fn delete(&self) {
        let now = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        for ns in [&self.apps_ns, &self.agents_ns] {
            if let Err(e) = ns
                .api::<Pod>()
                .delete_collection(&now, &ListParams::default())
                .await
            {
                eprintln!("warning: deleting the pods of {}: {e}", ns.name);
            }
        }
        let _ = self
            .apps_ns
            .api::<ReplicaSet>()
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await;
        delete_nodes(&self.client, std::process::id()).await;
        // The namespaces go when the TestNamespaces are dropped.
    }
}

pub(super) async fn delete_nodes(client: &Client, pid: u32) {
    let api = Api::<Node>::all(client.clone());
    let selector = format!("{NODE_LABEL}={pid}");
    if let Err(e) = api
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&selector),
        )
        .await
    {
        eprintln!("warning: deleting the fleet's Nodes ({selector}): {e}");
    }
}

/// Nodes of fleet benches whose process is gone (killed before cleaning up).
pub(super) async fn delete_stale_nodes(client: &Client) {
    let api = Api::<Node>::all(client.clone());
    let Ok(list) = api.list(&ListParams::default().labels(NODE_LABEL)).await else {
        return;
    };
    let mut pids: Vec<u32> = list
        .items
        .iter()
        .filter_map(|n| n.labels().get(NODE_LABEL)?.parse().ok())
        .filter(|pid| !process::alive(*pid))
        .collect();
    pids.sort_unstable();
    pids.dedup();
    for pid in pids {
        println!("    deleting Nodes left by fleet bench {pid}");
        delete_nodes(client, pid).await;
    }
}
