//! The node-local debug view: the unix socket streaming events ([`socket`]), the `flows` command
//! ([`command`]) and its rendering ([`flows`]), the names of peer addresses it shows ([`peers`]), and
//! the `status` command: what the running agent costs and whether it works ([`status`]).

pub mod command;
pub mod flows;
pub mod peers;
pub mod socket;
pub mod status;
