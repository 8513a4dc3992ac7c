//! What a filesystem's answers promise: which direct writes are held,
//! made durable first or sent through (`Answering`), the `fsync` cadence
//! the intent log watches, and `fsync` itself.

use super::{Filesystem, FsError};
use crate::pool::dataset::intent_log::{COPY_BLOCK_BYTES_MAX, COPY_BYTES_PER_COMMIT_MAX};
use crate::pool::dataset::props::SyncMode;
use crate::pool::dirty::WRITE_THROUGH_MIN_BYTES;
use crate::pool::Pool;
use std::rc::Rc;

/// The pool's tunable `fs_durable_writes_fsync_gap`.
fn durable_writes_gap(pool: &Pool) -> u32 {
    pool.tunables.borrow().fs_durable_writes_fsync_gap as u32
}

/// What a request is, for the durability of its answer
/// ([`Filesystem::request_began`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestKind {
    /// A direct write (`O_DIRECT`, `direct=always`) that is not
    /// synchronous: held behind or gone through ([`Answering::holds`]).
    DirectWrite,
    /// An `fsync`, or a request that notes nothing for the intent log (a
    /// read: an access time is not logged).
    NoChange,
    /// Anything else: its answer may rest on changes not yet durable.
    Changes,
}

/// A request being served ([`Filesystem::request_began`]). Its answer is
/// counted when it goes, after the request's changes were noted (a
/// request dropped unanswered counts as one that may rest on changes not
/// yet durable).
pub struct Answering<'a> {
    fs: &'a Filesystem,
    direct_write: bool,
    durable_first: bool,
    held: bool,
    /// Held for the commit that follows it to copy into the log.
    copied: bool,
    unsure: bool,
    answered: bool,
}

impl Answering<'_> {
    /// Whether this direct write is made durable before it is answered
    /// (through [`Pool::fs_log_commit`]).
    pub fn durable_first(&self) -> bool {
        self.durable_first
    }

    /// Whether this direct write, of `bytes`, is held in memory and
    /// answered, to be written out behind in batches as a volume's WRITE
    /// is ([`Filesystem::write_behind`]): of a client that does not call
    /// `fsync` often (every few writes: its writes are made durable
    /// first), or that calls it after every write when the commit started
    /// as the write is answered ([`Pool::fs_log_ahead`]) may copy it into
    /// the log (`logbias=latency`, not encrypted, small blocks, at most
    /// [`COPY_BYTES_PER_COMMIT_MAX`]), and
    /// shorter than [`WRITE_THROUGH_MIN_BYTES`] (a longer one is a run
    /// long enough for the devices already, written from the request's
    /// own buffer). `O_DIRECT` promises to bypass the caches, not to be
    /// durable (that is `fsync`'s or `O_DSYNC`'s): the held blocks are no
    /// cache (the read cache never sees them), and every `fsync` makes
    /// them durable (copied into its commit, or written out first). Measured on a mirror of two files, fio 16K random writes
    /// alternating binaries in one run: QD1 24k IOPS held against 7-10k
    /// written through, QD64 66k against 44-50k.
    pub fn holds(&self, bytes: usize) -> bool {
        let most = if self.copied {
            // A commit copies at most this much.
            COPY_BYTES_PER_COMMIT_MAX + 1
        } else {
            WRITE_THROUGH_MIN_BYTES
        };
        self.held && (bytes as u64) < most
    }

    /// The request was served (`ok`: it succeeded, and a write to be made
    /// durable first was); its answer leaves next.
    pub fn answered(mut self, ok: bool) {
        if self.durable_first && ok {
            self.fs.count(|stats| stats.durable_first_ops += 1);
        }
        // A direct write that failed may have linked some of its blocks
        // (a request noting nothing changed nothing, failed or not).
        self.unsure |= !ok && self.direct_write;
        self.answered = true;
    }
}

impl Drop for Answering<'_> {
    fn drop(&mut self) {
        if self.direct_write {
            self.fs.log.note_direct_write_done();
        }
        if self.unsure || !self.answered {
            self.fs.log.note_answer_unsure();
        }
    }
}

impl Filesystem {
    /// Notes an `fsync` (or `fdatasync`) arriving ([`Filesystem::fsync`]
    /// does): with the direct writes [`Filesystem::write`] and
    /// [`Filesystem::write_behind_lent`] note, the
    /// cadence that tells [`Pool::fs_log_ahead`] whether the next `fsync`
    /// is expected, and [`Filesystem::request_began`] whether a direct
    /// write is made durable first.
    pub fn note_fsync_arrived(&self, pool: &Pool) {
        self.log.note_flush_arrived(durable_writes_gap(pool));
    }

    /// Whether this filesystem's client has called `fsync` after every
    /// single direct write lately, and the write just answered is the only
    /// one since its last `fsync`: [`Pool::fs_log_ahead`] would start.
    pub fn fsync_expected(&self) -> bool {
        self.log.flush_expected()
    }

    /// Tells the filesystem that its front end serves a request of `kind`:
    /// the returned [`Answering`] says whether a direct write is to be made
    /// durable before it is answered, and, once the request's changes are
    /// noted, counts its answer for [`Filesystem::fsync`] (an `fsync`
    /// finding every answer before it durable commits nothing).
    pub fn request_began(&self, pool: &Pool, kind: RequestKind) -> Answering<'_> {
        let direct_write = kind == RequestKind::DirectWrite;
        if direct_write {
            self.log.note_direct_write_began();
        }
        let sync = self.settings().sync;
        let gap = durable_writes_gap(pool);
        let durable_first =
            direct_write && sync == SyncMode::Standard && self.log.writes_durable_first(gap);
        // Under `sync=disabled` an `fsync` waits for nothing, so a client
        // that calls it often loses nothing by its writes being held. A
        // direct write of a client that calls `fsync` after every write is
        // held too when the commit started as it is answered
        // ([`Pool::fs_log_ahead`]) may copy it into the log, as OpenZFS
        // copies small synchronous writes: written in place later, in the
        // write-outs' batches. Measured (fio 16K random writes, QD1,
        // `--fsync=1`, mirror of two files, three alternated rounds):
        // 2.9-3.4k IOPS against 2.3-2.7k written through first. Writes
        // made durable first (`fsync`s every few writes, in parallel) go
        // through: held and copied, they ran at 13-18k IOPS against
        // 18-23k (QD64, `--fsync=32`), each commit copying a few while
        // the rest were written out for it.
        let copied = !durable_first
            && self.log.flushes_after_each_write()
            && self.copies_held_blocks()
            && u64::from(self.record_bytes()) <= COPY_BLOCK_BYTES_MAX
            && self.copy_fits();
        let held = direct_write
            && !self.snapshot
            && (sync == SyncMode::Disabled
                || copied
                || (!durable_first && !self.log.flushes_often(gap)));
        Answering {
            fs: self,
            direct_write,
            durable_first,
            held,
            copied,
            unsure: kind == RequestKind::Changes || (direct_write && !durable_first),
            answered: false,
        }
    }

    /// `fsync` or `fdatasync` of `node` (a file or a directory): what was
    /// answered before it made durable, through the intent log when it
    /// carries every change since the last durable txg, else a txg. A
    /// write written behind and lost since is reported here. When every
    /// answer given before it is durable already (its client's direct
    /// writes were made durable first, [`Filesystem::request_began`]), it
    /// commits nothing: the kernel keeps the file's writes out while an
    /// `fsync` is in the server.
    ///
    /// Under `sync=disabled` it returns at once, as OpenZFS's does: it
    /// waits neither for a commit nor for the writes held behind (a write
    /// that already failed is reported; one that fails later, at the next
    /// `fsync`). Waiting for those held the file's writes out for their
    /// write-out: fio's 16K random writes at QD64 with `--fsync=32` got 8.7k
    /// IOPS where the same writes without `fsync` got 45k.
    pub async fn fsync(self: &Rc<Self>, pool: &Rc<Pool>, node: u64) -> Result<(), FsError> {
        self.note_fsync_arrived(pool);
        if self.settings().sync == SyncMode::Disabled {
            return self.take_write_error(node).map_or(Ok(()), Err);
        }
        // Held writes the commit copies into the log need not be written
        // out first: the kernel keeps the file's writes out while an
        // `fsync` is in the server.
        if !self.copy_fits() {
            self.settle_writes(Some(node)).await;
        }
        if let Some(error) = self.take_write_error(node) {
            return Err(error);
        }
        if self.log.answers_durable() {
            self.count(|stats| stats.fsyncs_found_durable += 1);
        } else {
            pool.fs_log_commit(self).await?;
        }
        self.count_flush();
        Ok(())
    }

    /// An `fsync` was made durable (counted as a volume's FLUSH is).
    pub fn count_flush(&self) {
        self.count(|stats| stats.flush_ops += 1);
    }
}
