//! The NBD front end: the wire protocol ([`proto`]) and the server ([`server`]).

pub mod proto;
pub mod server;
