//! Name grants written straight into the enforcement table's name sets over netlink: the answer that
//! brings them waits for this write, and an `nft` process would make it wait milliseconds.
//!
//! A grant is one element of a set of type `addr . addr . inet_proto . inet_service` with `flags
//! interval, timeout`: its key is the concatenation of the fields, each in its own 4-byte register
//! (the protocol's one byte and the port's two, big-endian, first in theirs); an interval element also
//! has the key of its last port (`KEY_END`): the elements `nft` writes for the same grants when the
//! whole table is rendered ([`crate::enforce::nft::render_with`]).

use super::grants::Grant;
use super::netlink::{Batch, Family, NLM_F_CREATE};
use crate::enforce::nft::{NAMES_SET_V4, NAMES_SET_V6};
use network_enforcer_api::Protocol;
use std::io;
use std::net::IpAddr;
use std::time::Duration;

const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_DELSETELEM: u16 = 14;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_TIMEOUT: u16 = 4;
const NFTA_SET_ELEM_KEY_END: u16 = 10;
const NFTA_DATA_VALUE: u16 = 1;

/// Puts `new` grants into table `table`'s name sets and moves the end of `extended` ones (added,
/// removed and added again with the new timeout: adding leaves an element that exists as it is), in
/// one transaction. New grants are only added: removing an element costs the kernel a grace period
/// (~20 ms here), and the answer waits for them.
pub fn write(
    table: &str,
    new: &[(Grant, Duration)],
    extended: &[(Grant, Duration)],
) -> io::Result<()> {
    let mut batch = Batch::new();
    for (grant, left) in extended {
        element(&mut batch, NFT_MSG_NEWSETELEM, table, grant, None);
        element(&mut batch, NFT_MSG_DELSETELEM, table, grant, None);
        element(&mut batch, NFT_MSG_NEWSETELEM, table, grant, Some(*left));
    }
    for (grant, left) in new {
        element(&mut batch, NFT_MSG_NEWSETELEM, table, grant, Some(*left));
    }
    batch.send()
}

/// Removes `grants` from table `table`'s name sets (added first, so that one already gone is no
/// error).
pub fn remove(table: &str, grants: &[(Grant, Duration)]) -> io::Result<()> {
    let mut batch = Batch::new();
    for (grant, _) in grants {
        element(&mut batch, NFT_MSG_NEWSETELEM, table, grant, None);
        element(&mut batch, NFT_MSG_DELSETELEM, table, grant, None);
    }
    batch.send()
}

/// One message about `grant`'s element.
fn element(batch: &mut Batch, kind: u16, table: &str, grant: &Grant, timeout: Option<Duration>) {
    let set = if grant.pod.is_ipv4() {
        NAMES_SET_V4
    } else {
        NAMES_SET_V6
    };
    let flags = if kind == NFT_MSG_NEWSETELEM {
        NLM_F_CREATE
    } else {
        0
    };
    batch.message(kind, flags, Family::Inet, |b| {
        b.attr_str(NFTA_SET_ELEM_LIST_TABLE, table);
        b.attr_str(NFTA_SET_ELEM_LIST_SET, set);
        b.nested(NFTA_SET_ELEM_LIST_ELEMENTS, |b| {
            b.nested(NFTA_LIST_ELEM, |b| {
                b.nested(NFTA_SET_ELEM_KEY, |b| {
                    b.attr(NFTA_DATA_VALUE, &key(grant, grant.ports.first))
                });
                b.nested(NFTA_SET_ELEM_KEY_END, |b| {
                    b.attr(NFTA_DATA_VALUE, &key(grant, grant.ports.last))
                });
                if let Some(timeout) = timeout {
                    let ms = u64::try_from(timeout.as_millis())
                        .unwrap_or(u64::MAX)
                        .max(1);
                    b.attr(NFTA_SET_ELEM_TIMEOUT, &ms.to_be_bytes());
                }
            });
        });
    });
}

/// The concatenated key of `grant` with port `port`.
fn key(grant: &Grant, port: u16) -> Vec<u8> {
    let mut key = Vec::with_capacity(40);
    for address in [grant.pod, grant.address] {
        match address {
            IpAddr::V4(a) => key.extend_from_slice(&a.octets()),
            IpAddr::V6(a) => key.extend_from_slice(&a.octets()),
        }
    }
    let protocol: u8 = match grant.ports.protocol {
        Protocol::TCP => 6,
        Protocol::UDP => 17,
        Protocol::SCTP => 132,
    };
    key.extend_from_slice(&[protocol, 0, 0, 0]);
    let port = port.to_be_bytes();
    key.extend_from_slice(&[port[0], port[1], 0, 0]);
    key
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::enforce::compile::PortRange;

    #[test]
    fn a_key_is_each_field_in_its_own_four_bytes() {
        let grant = Grant {
            pod: "10.0.0.5".parse().unwrap(),
            address: "203.0.113.10".parse().unwrap(),
            ports: PortRange {
                protocol: Protocol::TCP,
                first: 443,
                last: 8443,
            },
        };
        assert_eq!(
            key(&grant, grant.ports.first),
            [10, 0, 0, 5, 203, 0, 113, 10, 6, 0, 0, 0, 0x01, 0xbb, 0, 0]
        );
        assert_eq!(key(&grant, grant.ports.last)[12..14], [0x20, 0xfb]);
        let v6 = Grant {
            pod: "fd00::5".parse().unwrap(),
            address: "2001:db8::7".parse().unwrap(),
            ..grant
        };
        assert_eq!(key(&v6, 53).len(), 40);
    }
}
