//! Administration: the commands ([`commands`]), the control socket of a running
//! server ([`server`]), the client the CLI uses to reach it ([`client`]) and
//! the Prometheus endpoint ([`metrics`]).

pub mod client;
pub mod commands;
pub mod metrics;
pub mod server;
