//! Flow sources the controller reads itself (docs/behaviour.md §7, docs/flow-sources.md). Agents read the per-node ones
//! (eBPF, Hubble, ztunnel); cluster-wide ones live here:
//!
//! - [`goldmane`]: Calico Goldmane's `goldmane.Flows/Stream`, fed into the same learning and violation
//!   evidence path as agent batches.

pub mod goldmane;
