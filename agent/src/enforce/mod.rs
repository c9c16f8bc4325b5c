//! NetworkPolicy enforcement by the agent, for clusters whose CNI does not enforce (`--enforcement
//! networkpolicy`; off by default). Every `networking.k8s.io/v1` NetworkPolicy selecting a pod of this
//! node is enforced, ours and hand-written ones alike. Reading order:
//! - [`model`]: what is known about pods, namespaces and policies (plain data);
//! - [`compile`]: NetworkPolicy semantics → which pods of the node are isolated, and what they may
//!   still send and receive (pure, table-tested);
//! - [`nft`]: that ruleset as one nftables table, replaced atomically;
//! - [`sandbox`]: a new pod's addresses read on the node, before the API server has them;
//! - [`watch`]: the watches feeding the model and the loop that keeps the table current;
//! - [`nflog`]: the packets the table denies, read back from the kernel;
//! - [`deny`]: those denials as flow records (deny evidence for the controller).

pub mod compile;
pub mod deny;
pub mod dns_hold;
pub mod metrics;
pub mod model;
pub mod nflog;
pub mod nft;
pub mod sandbox;
pub mod watch;
