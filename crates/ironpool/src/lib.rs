//! ironpool: a copy-on-write, checksummed storage pool engine whose I/O path is
//! asynchronous end to end, serving volumes over NBD.
//!
//! Layers, top to bottom (imports point down only):
//! - [`nbd`], [`control`]: front ends.
//! - [`pool`]: the pool (import, transactions, volumes, scrub).
//! - [`object`]: objects as copy-on-write block-pointer trees.
//! - [`alloc`]: space allocation (metaslabs, space maps).
//! - [`vdev`]: mirrors, stripes, and the per-leaf I/O queue.
//! - [`dev`]: leaf devices (io_uring files and block devices, simulated devices).
//! - [`format`]: every on-disk structure with its encoding and checksum.
//! - [`rt`]: the single-threaded runtime over io_uring or the simulator.

pub mod alloc;
pub mod block;
pub mod control;
pub mod dev;
pub mod format;
pub mod nbd;
pub mod object;
pub mod pool;
pub mod queue;
pub mod rt;
pub mod units;
pub mod vdev;
