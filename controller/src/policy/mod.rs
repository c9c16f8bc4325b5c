//! Policy decisions: what a promotion does ([`promote`]), what a policy renders into ([`render`]),
//! which policy wins a target ([`uniqueness`]) and the conditions reported on each object.

pub mod authorization_policy;
pub mod conditions;
pub mod promote;
pub mod render;
pub mod uniqueness;
