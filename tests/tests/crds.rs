//! Our CRDs (`charts/network-enforcer/crds/`) install into the local cluster's v1.20 API server (with
//! what v1.20 cannot take stripped, see `fixture::strip_for_v1_20`) and become established.

use anyhow::Result;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use network_enforcer_tests::fixture::{TestNamespace, crds_dir};

#[tokio::test]
async fn chart_crds_install_and_are_established() -> Result<()> {
    let ns = TestNamespace::create_with_crds("crds").await?;
    let crds = Api::<CustomResourceDefinition>::all(ns.client.clone());
    for entry in std::fs::read_dir(crds_dir())? {
        let text = std::fs::read_to_string(entry?.path())?;
        let file: serde_yaml::Value = serde_yaml::from_str(&text)?;
        let name = file["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let crd = crds.get(&name).await?;
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        assert!(established, "CRD {name} is not established");
    }
    Ok(())
}
