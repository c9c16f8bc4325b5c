//! Tables for people: the check report, and the cells and layout the other reports share.

use super::*;

/// A pod, an address, or the name the address was resolved from with the address:
/// `api.example.test (203.0.113.10)`.
pub(super) fn peer_text(peer: &ScenarioPeer) -> String {
    match (&peer.pod, peer.ip, &peer.name) {
        (Some(pod), _, _) => pod.clone(),
        (None, Some(ip), Some(name)) => format!("{name} ({ip})"),
        (None, Some(ip), None) => ip.to_string(),
        (None, None, _) => "-".into(),
    }
}

pub(super) fn side_text(side: &Side) -> String {
    let verdict = if side.allowed { "allow" } else { "deny" };
    if side.decided_by.is_some()
        && let Some(step) = side.tiers.last()
    {
        return format!(
            "{verdict} (cnp/{} {} rule {})",
            step.policy, step.tier, step.index
        );
    }
    if side.policies.is_empty() {
        return format!("{verdict} (not isolated)");
    }
    let names: Vec<String> = side.policies.iter().map(explain::policy_text).collect();
    format!("{verdict} ({})", names.join(", "))
}

pub(super) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[&str]| {
        let text: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", text.join("  ").trim_end());
    };
    line(header);
    for row in rows {
        line(&row.iter().map(String::as_str).collect::<Vec<_>>());
    }
    out
}

impl CheckReport {
    /// A table for people: one row per flow, in input order; explained results
    /// ([`Checker::explain`]) take two, egress then ingress, with the explanation of each.
    pub fn render_table(&self) -> String {
        if self.results.iter().any(|r| r.egress.decision.is_some()) {
            return self.render_explained_table();
        }
        let rows: Vec<Vec<String>> = self
            .results
            .iter()
            .map(|r| {
                vec![
                    peer_text(&r.from),
                    peer_text(&r.to),
                    r.protocol.to_string(),
                    r.port.to_string(),
                    if r.allowed { "ALLOW" } else { "DENY" }.to_string(),
                    side_text(&r.egress),
                    side_text(&r.ingress),
                ]
            })
            .collect();
        table(
            &[
                "FROM", "TO", "PROTO", "PORT", "VERDICT", "EGRESS", "INGRESS",
            ],
            &rows,
        )
    }
}

impl CheckReport {
    fn render_explained_table(&self) -> String {
        let mut rows = Vec::new();
        for r in &self.results {
            rows.push(vec![
                peer_text(&r.from),
                peer_text(&r.to),
                r.protocol.to_string(),
                r.port.to_string(),
                if r.allowed { "ALLOW" } else { "DENY" }.to_string(),
                "egress".to_string(),
                explain::explanation_text(&r.egress),
            ]);
            let mut ingress = vec![String::new(); 5];
            ingress.extend(["ingress".to_string(), explain::explanation_text(&r.ingress)]);
            rows.push(ingress);
        }
        table(
            &["FROM", "TO", "PROTO", "PORT", "VERDICT", "SIDE", "DECISION"],
            &rows,
        )
    }
}
