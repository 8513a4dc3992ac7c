//! Administration: the commands ([`commands`]), the control socket of a running
//! server ([`server`]) and the client the CLI uses to reach it ([`client`]).

pub mod client;
pub mod commands;
pub mod server;
