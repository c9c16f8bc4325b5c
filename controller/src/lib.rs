//! The network-enforcer controller library.
