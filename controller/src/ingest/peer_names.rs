//! Names of outside peers, interned: a record carries a 2-byte [`PeerName`], so the evidence queue's
//! bound in records stays a bound in memory (a name is up to 253 bytes, and an agent may repeat one
//! in every record). The table is append-only and bounded ([`MAX_PEER_NAMES`]): once full, a new
//! name is left out of its record (which is still taken, by its address) and counted, and names
//! already known keep working.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};

/// Distinct names the controller keeps (about 17 MB at most; an id is 16 bits, three values are
/// reserved).
pub const MAX_PEER_NAMES: usize = 65_000;

/// A record's peer name: none, a name of the table, or why it was left out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PeerName(u16);

const NONE: u16 = 0;
const REFUSED: u16 = u16::MAX;
const FULL: u16 = u16::MAX - 1;

impl PeerName {
    /// No name given.
    pub const NONE: PeerName = PeerName(NONE);
    /// A name that is not a host name ([`network_enforcer_api::dns_name::host_name`]).
    pub const REFUSED: PeerName = PeerName(REFUSED);
    /// A new name while the table was full.
    pub const TABLE_FULL: PeerName = PeerName(FULL);

    /// `text` (a record's `peer_name`), checked and interned.
    pub fn of(text: &str) -> Self {
        if text.is_empty() {
            return Self::NONE;
        }
        match network_enforcer_api::dns_name::host_name(text) {
            Ok(name) => intern(name),
            Err(_) => Self::REFUSED,
        }
    }

    /// The name, when there is one.
    pub fn name(self) -> Option<Arc<str>> {
        if matches!(self.0, NONE | REFUSED | FULL) {
            return None;
        }
        let table = table().read().unwrap_or_else(|p| p.into_inner());
        table.names.get(self.0 as usize - 1).cloned()
    }

    /// Why the record's name was left out, if it was: `peer_name_refused` or `peer_name_table_full`
    /// (the `outcome` of `resolutions_total`).
    pub fn left_out(self) -> Option<&'static str> {
        match self.0 {
            REFUSED => Some("peer_name_refused"),
            FULL => Some("peer_name_table_full"),
            _ => None,
        }
    }
}

#[derive(Default)]
struct Table {
    ids: HashMap<Arc<str>, u16>,
    names: Vec<Arc<str>>,
}

fn table() -> &'static RwLock<Table> {
    static TABLE: OnceLock<RwLock<Table>> = OnceLock::new();
    TABLE.get_or_init(RwLock::default)
}

fn intern(name: String) -> PeerName {
    if let Some(&id) = table()
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .ids
        .get(name.as_str())
    {
        return PeerName(id);
    }
    let mut table = table().write().unwrap_or_else(|p| p.into_inner());
    if let Some(&id) = table.ids.get(name.as_str()) {
        return PeerName(id);
    }
    if table.names.len() >= MAX_PEER_NAMES {
        return PeerName::TABLE_FULL;
    }
    let name: Arc<str> = name.into();
    table.names.push(name.clone());
    // At most MAX_PEER_NAMES, below the reserved values.
    let id = table.names.len() as u16;
    table.ids.insert(name, id);
    PeerName(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_lower_cased_and_shared() {
        let a = PeerName::of("API.Partner.Test.");
        assert_eq!(a.name().as_deref(), Some("api.partner.test"));
        assert_eq!(PeerName::of("api.partner.test"), a, "one id per name");
        assert_eq!(PeerName::of(""), PeerName::NONE);
        assert_eq!(PeerName::NONE.name(), None);
        assert_eq!(PeerName::of("bad name"), PeerName::REFUSED);
        assert_eq!(PeerName::REFUSED.name(), None);
        assert_eq!(PeerName::REFUSED.left_out(), Some("peer_name_refused"));
        assert_eq!(a.left_out(), None);
        assert_eq!(std::mem::size_of::<PeerName>(), 2);
    }
}
