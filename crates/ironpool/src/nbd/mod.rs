//! The NBD server: the wire protocol ([`proto`]), the front end on its own
//! thread ([`server`]) and the engine side that runs requests ([`engine`]).

pub mod engine;
pub mod proto;
pub mod server;
