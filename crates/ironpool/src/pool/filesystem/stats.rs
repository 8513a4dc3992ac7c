//! What a filesystem reports about itself: its file I/O, its front end's
//! requests, its intent log, and `statfs`.

use serde::Serialize;

use super::Filesystem;
use crate::pool::Pool;

/// What a filesystem's file I/O did since import (`iostat`), with the
/// names and meanings of a volume's counters so tools read both alike.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct FsIoStats {
    pub read_ops: u64,
    pub write_ops: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Direct reads, which keep nothing in the read cache (`O_DIRECT` with
    /// `direct=standard`, taking a block from it when it is there; every
    /// read with `direct=always`), and direct writes, held or gone through
    /// (as every write, they never enter the read cache), as a volume
    /// counts them.
    pub direct_read_ops: u64,
    pub direct_write_ops: u64,
    /// Writes that went to the devices before they were answered (direct
    /// ones not held, synchronous ones, those that could not be held), and
    /// `fallocate`'s pieces of zeros.
    pub through_write_ops: u64,
    /// Writes answered once in memory, their blocks written out after
    /// (`behind.rs`), and write-outs of theirs that failed.
    pub behind_write_ops: u64,
    pub behind_failures: u64,
    /// Of `behind_write_ops`, those that grew a file's one block in memory
    /// (a small file written in pieces).
    pub behind_grow_ops: u64,
    /// Write-outs that linked nothing: their file's one block grew in
    /// memory meanwhile, and the newer version carries their bytes.
    pub behind_superseded: u64,
    /// Writes that covered part of a block and read the old block first.
    pub rmw_write_ops: u64,
    /// Blocks read that were holes (answered with zeros, no device I/O).
    pub hole_read_ops: u64,
    /// `fsync`, `fdatasync` and `fsync` of directories.
    pub flush_ops: u64,
    /// Direct writes made durable before they were answered, their client
    /// calling `fsync` every few writes (`DURABLE_WRITES_FSYNC_GAP_MAX`),
    /// and `fsync`s that then found every answer before them durable and
    /// committed nothing.
    pub durable_first_ops: u64,
    pub fsyncs_found_durable: u64,
    /// Records `copy_file_range` cloned (linked again, no bytes written).
    pub cloned_blocks: u64,
}

/// What the front end serving a filesystem (FUSE) reports about itself,
/// for `fs list` and `iostat`: how requests reach it, and how many it
/// serves at once (an application's queue depth should reach it whole).
#[derive(Clone, Debug, Default, Serialize)]
pub struct FrontEndStats {
    /// How requests come (e.g. `io_uring (2 queues x 64 slots)`); empty
    /// when nothing serves the filesystem.
    pub transport: String,
    /// Requests answered since it was mounted.
    pub requests: u64,
    /// Requests being served now, and the most at once since mounted.
    pub in_flight: u64,
    pub in_flight_max: u64,
    /// WRITEs whose payload was read from `/dev/fuse` into a buffer of its
    /// own (after a WRITE of the same size): their whole blocks are held
    /// with no copy.
    pub write_payloads_apart: u64,
    /// Requests by kind (the kernel's opcode name) since mounted: how many
    /// an application's calls cost (a create is a LOOKUP, a CREATE and a
    /// GETATTR of its directory, each a round trip), and how long the
    /// server held each kind.
    pub ops: std::collections::BTreeMap<&'static str, OpStats>,
}

/// One kind of FUSE request served by a filesystem's front end.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct OpStats {
    /// Requests of the kind (those the kernel expects no reply to as well).
    pub count: u64,
    /// Microseconds from each request's arrival at the server to its reply,
    /// summed: the server's share of the round trip (with the devices' for
    /// a request that waits on them).
    pub service_us: u64,
}

/// What `statfs` reports.
#[derive(Clone, Copy, Debug)]
pub struct FsStats {
    /// Allocated and available bytes together, as OpenZFS reports a
    /// filesystem's size: the space held for metadata is neither.
    pub total_bytes: u64,
    /// Bytes of data that still fit in the pool, counting the space of
    /// removed files on its way back (see `Pool::writable_bytes`).
    pub available_bytes: u64,
    pub objects: u64,
}

impl Filesystem {
    /// The counters of the filesystem's intent log (`fsync`).
    pub fn log_stats(&self) -> crate::pool::dataset::intent_log::LogStats {
        self.log.stats()
    }

    /// Whether its intent log was claimed at import and waits for its
    /// key's load to be replayed (an encrypted filesystem after a crash).
    pub fn log_claimed(&self) -> bool {
        self.log.is_claimed()
    }

    /// What its file I/O did since import.
    pub fn io_stats(&self) -> FsIoStats {
        self.io_stats.get()
    }

    /// Counts a direct write served (held or gone through), for
    /// `direct_write_ops`: the front end knows which writes are direct.
    pub fn count_direct_write(&self) {
        self.count(|stats| stats.direct_write_ops += 1);
    }

    pub(super) fn count(&self, change: impl FnOnce(&mut FsIoStats)) {
        let mut stats = self.io_stats.get();
        change(&mut stats);
        self.io_stats.set(stats);
    }

    /// What its front end last reported.
    pub fn front_end(&self) -> FrontEndStats {
        self.front_end.borrow().clone()
    }

    /// The front end reports a change (its transport, a request).
    pub fn note_front_end(&self, change: impl FnOnce(&mut FrontEndStats)) {
        change(&mut self.front_end.borrow_mut());
    }

    /// Space and objects for `statfs`.
    pub fn stats(&self, pool: &Pool) -> FsStats {
        let (size_bytes, free_bytes) = pool.space();
        // The size leaves out what metadata may take; what is being freed
        // is available (a write waits for it), so it is no longer used.
        let (total_bytes, available_bytes) = pool.limited_space(
            crate::pool::Owner::Filesystem(self),
            size_bytes - free_bytes + pool.data_available_bytes(),
            pool.writable_bytes(),
        );
        FsStats {
            total_bytes,
            available_bytes,
            objects: self.header.get().objects,
        }
    }
}
