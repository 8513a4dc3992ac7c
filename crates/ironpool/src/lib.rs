//! ironpool: a copy-on-write, checksummed storage pool engine whose I/O path is
//! asynchronous end to end, serving volumes over NBD.
//!
//! Layers, top to bottom (imports point down only; `tests/layers.rs` checks
//! it, and `docs/ARCHITECTURE.md` walks a WRITE and a FLUSH through them):
//! - [`control`]: the control socket and its commands.
//! - [`nbd`]: the NBD server; [`fuse`]: the FUSE server (filesystems).
//! - [`pool`]: the pool (import, txgs, device states) with its datasets
//!   ([`pool::dataset`]), the volume data path ([`pool::volume`]) and scans
//!   ([`pool::scan`]) and filesystems ([`pool::filesystem`]).
//! - [`object`]: objects as copy-on-write block-pointer trees.
//! - [`block`]: verified reads with self-heal, writes of every copy,
//!   compression.
//! - [`cache`]: the read cache (ARC) of verified blocks the block layer
//!   serves reads from.
//! - [`alloc`]: space allocation (metaslabs, space maps).
//! - [`vdev`]: disks, mirrors and RAID-Z over the leaf queues.
//! - [`queue`]: the per-leaf I/O queue (classes, aggregation, statistics).
//! - [`dev`]: leaf devices (io_uring files and block devices, simulated devices).
//! - [`format`]: every on-disk structure with its encoding and checksum.
//! - [`rt`], [`units`], [`events`]: the single-threaded runtime over io_uring
//!   or the simulator; sizes; the event ring every layer posts to.

pub mod alloc;
pub mod block;
pub mod cache;
pub mod control;
pub mod crypto;
pub mod dev;
pub mod events;
pub mod format;
pub mod fuse;
pub mod nbd;
pub mod object;
pub mod pool;
pub mod queue;
pub mod rt;
pub mod units;
pub mod vdev;
