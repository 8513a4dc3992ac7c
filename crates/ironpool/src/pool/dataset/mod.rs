//! Datasets: what the pool stores for its users, and how it is named and moved.
//!
//! - [`directory`]: the pool directory (object 1) naming every dataset.
//! - [`intent_log`]: the log that makes a FLUSH one log write.
//! - [`props`]: properties, set on a dataset or inherited from the pool.
//! - [`snapshot`]: snapshots, clones, rollback and promote.
//! - [`send`] and [`receive`]: a snapshot as a stream, and back, through
//!   [`stream_io`]'s ends (a descriptor or memory).
//!
//! Each dataset kind's data path has its own module beside this one
//! ([`super::volume`] for volumes).

pub mod directory;
pub mod intent_log;
pub mod props;
pub mod receive;
pub mod send;
pub mod snapshot;
pub mod stream_io;
