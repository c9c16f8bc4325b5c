//! Monitor: policy evaluation ([`evaluate`]), violation evidence and attribution ([`violations`]),
//! the status writer ([`status_sync`]), the history of observed edges behind the protect gate
//! ([`edge_history`], persisted between leaders by [`history_store`]), the OTLP log export ([`otlp`]) and agent coverage ([`coverage`]). What they do:
//! docs/behaviour.md §3 and §6; why: docs/design.md, "Violations".

pub mod coverage;
pub mod edge_history;
pub mod evaluate;
pub mod history_store;
pub mod otlp;
pub mod status_sync;
pub mod violations;
