//! The node-local debug view: the unix socket streaming events ([`socket`]), the `flows` command
//! ([`command`]) and its rendering ([`flows`]), and the names of peer addresses it shows ([`peers`]).

pub mod command;
pub mod flows;
pub mod peers;
pub mod socket;
