//! Names of outside peers (issue 41, first part): which names each pod resolved to which addresses,
//! from the DNS messages its sockets sent and received. Reading order:
//! - [`wire`]: the DNS wire format read in place, without copying or allocating (pure);
//! - [`answer`]: one response read for the asked name and the addresses it resolves to, through
//!   CNAMEs, with TTLs; hostile responses refused by bound (pure);
//! - [`tracker`]: queries matched with their answers (same pod socket, server and transaction id,
//!   same question), and what each pod resolved, kept for its TTL plus a grace; bounded per pod and per
//!   node, with counters (pure).
//!
//! Not yet: the capture that feeds the tracker from the pods' DNS packets, and learning by name.

pub mod answer;
pub mod tracker;
pub mod wire;

#[cfg(test)]
mod tests;
