//! What every component reads the same way from a Pod's status.

use k8s_openapi::api::core::v1::Pod;
use std::net::IpAddr;

/// The pod's addresses: `status.podIPs`, or `status.podIP` on API servers that fill only that one.
/// Unparsable entries are skipped.
pub fn ips(pod: &Pod) -> Vec<IpAddr> {
    let status = pod.status.as_ref();
    let mut ips: Vec<IpAddr> = status
        .and_then(|s| s.pod_ips.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|ip| ip.ip.parse().ok())
        .collect();
    if ips.is_empty() {
        ips.extend(
            status
                .and_then(|s| s.pod_ip.as_deref())
                .and_then(|ip| ip.parse::<IpAddr>().ok()),
        );
    }
    ips
}

/// Phase Succeeded or Failed: the pod has given its address back (a new pod may get it).
pub fn finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ips_prefer_pod_ips_and_fall_back_to_pod_ip() {
        let cases = [
            (
                json!({"podIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}], "podIP": "10.0.0.1"}),
                vec!["10.0.0.1", "fd00::1"],
            ),
            (json!({"podIP": "10.0.0.2"}), vec!["10.0.0.2"]),
            (
                json!({"podIPs": [{"ip": "bad"}], "podIP": "10.0.0.3"}),
                vec!["10.0.0.3"],
            ),
            (json!({}), vec![]),
        ];
        for (status, expected) in cases {
            let pod: Pod = serde_json::from_value(json!({"status": status})).unwrap();
            let expected: Vec<IpAddr> = expected.iter().map(|i| i.parse().unwrap()).collect();
            assert_eq!(ips(&pod), expected, "{status}");
        }
        for (phase, done) in [
            ("Running", false),
            ("Pending", false),
            ("Succeeded", true),
            ("Failed", true),
        ] {
            let pod: Pod = serde_json::from_value(json!({"status": {"phase": phase}})).unwrap();
            assert_eq!(finished(&pod), done, "{phase}");
        }
    }
}
