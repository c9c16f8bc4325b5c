//! The node-local debug view: the unix socket streaming events ([`socket`]) and the `flows` CLI ([`flows`]).

pub mod flows;
pub mod socket;
