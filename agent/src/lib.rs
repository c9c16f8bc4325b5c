//! The network-enforcer node agent library.
