//! Nodes and their addresses.

use super::*;

impl Index {
    /// Adds or updates a node's addresses.
    pub fn apply_node(&mut self, node: &Node) {
        let name = node.name_any();
        let mut changed = self.remove_node(&name);
        for a in node
            .status
            .iter()
            .flat_map(|s| s.addresses.iter().flatten())
        {
            if let Ok(ip) = a.address.parse() {
                self.nodes.insert(ip, name.clone());
                changed.push(ip);
            }
        }
        self.recompute_backends_at(changed);
    }

    /// Removes a node.
    pub fn delete_node(&mut self, name: &str) {
        let changed = self.remove_node(name);
        self.recompute_backends_at(changed);
    }

    /// Forgets the addresses of the node `name`; returns them.
    pub(super) fn remove_node(&mut self, name: &str) -> Vec<IpAddr> {
        let mut removed = Vec::new();
        self.nodes.retain(|ip, n| {
            let keep = n != name;
            if !keep {
                removed.push(*ip);
            }
            keep
        });
        removed
    }
}
