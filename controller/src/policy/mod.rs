//! Policy decisions: what a promotion does ([`promote`]), what a policy renders into ([`render`]),
//! which policy wins a target ([`uniqueness`]), what an invalid policy leaves in force ([`validity`]),
//! whether a proposal is what the controller learned ([`crate::learn::provenance`]), how much each rule is used
//! ([`rule_usage`]), what the observed traffic says before protect ([`protect_gate`]) and the conditions reported on each object
//! ([`conditions`], [`standing`]), and what a promoted cluster proposal puts in force
//! ([`cluster_promote`]).

pub mod cluster_promote;
pub mod conditions;
pub mod promote;
pub mod protect_gate;
pub mod render;
pub mod rule_usage;
pub mod standing;
pub mod uniqueness;
pub mod validity;
