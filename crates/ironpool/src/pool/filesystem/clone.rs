//! `copy_file_range(2)` within a filesystem: whole records are cloned (the
//! destination links the source's blocks, counted in the pool's block
//! reference table, as OpenZFS 2.2's block cloning), the rest is copied.
//!
//! A clone takes no space until one side rewrites the block; it counts
//! toward the destination's quotas as a copy would (its `referenced`
//! grows), as in OpenZFS. The intent log does not carry clones: a file
//! with a clone not yet committed makes the next `fsync` commit a txg.

use std::rc::Rc;

use super::{Filesystem, FsError};
use crate::format::{BlockPointer, ObjectType};
use crate::pool::Pool;

/// Records cloned under one hold of the files' locks: a clone of a large
/// file lets the filesystem's other requests and the txg builds in
/// between, and a turn's links stay a bounded part of a txg.
const CLONE_BLOCKS_PER_TURN: u64 = 1024;
/// Bytes copied per turn where records cannot be cloned (ranges that do
/// not line up with records, files of different record sizes): the
/// memory a copy holds at once.
const COPY_CHUNK_BYTES: u64 = 1 << 20;
/// Bytes one call copies at most: the FUSE reply counts them in 32 bits,
/// and callers (cp, the kernel) call again for the rest.
pub const COPY_RANGE_BYTES_MAX: u64 = 1 << 30;

impl Filesystem {
    /// Copies `length` bytes at `offset_in` of file `ino_in` of `source`
    /// (this filesystem, or one of its snapshots) to `offset_out` of file
    /// `ino_out` (the same file too, ranges not overlapping), stopping at
    /// the end of the source; returns the bytes copied. Within this
    /// filesystem, records that line up in both files and have the same
    /// size are cloned; the rest is read and written. The destination
    /// grows to the end of what was copied.
    #[allow(clippy::too_many_arguments)]
    pub async fn copy_range(
        &self,
        pool: &Rc<Pool>,
        source: &Filesystem,
        ino_in: u64,
        offset_in: u64,
        ino_out: u64,
        offset_out: u64,
        length: u64,
    ) -> Result<u64, FsError> {
        let size_in = {
            let _shared = source.lock.acquire(1).await;
            let (object, znode) = source.load(ino_in).await?;
            if znode.is_dir() {
                return Err(FsError::IsDir);
            }
            object.length_bytes()
        };
        if offset_in >= size_in {
            return Ok(0);
        }
        let length = length.min(size_in - offset_in).min(COPY_RANGE_BYTES_MAX);
        super::write_end(offset_out, length as usize)?;
        let same = std::ptr::eq(source, self);
        if same
            && ino_in == ino_out
            && offset_in < offset_out + length
            && offset_out < offset_in + length
        {
            return Err(FsError::Invalid("copy onto an overlapping range".into()));
        }
        let mut done = 0;
        while done < length {
            match self
                .copy_turn(
                    pool,
                    source,
                    same,
                    ino_in,
                    offset_in + done,
                    ino_out,
                    offset_out + done,
                    length - done,
                )
                .await
            {
                Ok(0) => break,
                Ok(copied) => done += copied,
                // What was copied before the failure is answered; the
                // failure comes again at the next call, if it lasts.
                Err(_) if done > 0 => break,
                Err(error) => return Err(error),
            }
        }
        Ok(done)
    }

    /// One turn of [`Filesystem::copy_range`]: records cloned, or else
    /// bytes read and written up to the next record boundary where cloning
    /// may start (a chunk where it cannot). Returns the bytes copied (0:
    /// the source ends there).
    #[allow(clippy::too_many_arguments)]
    async fn copy_turn(
        &self,
        pool: &Rc<Pool>,
        source: &Filesystem,
        same: bool,
        ino_in: u64,
        position_in: u64,
        ino_out: u64,
        position_out: u64,
        length: u64,
    ) -> Result<u64, FsError> {
        if same {
            let cloned = self
                .clone_records(pool, ino_in, position_in, ino_out, position_out, length)
                .await?;
            if cloned > 0 {
                return Ok(cloned);
            }
        }
        let record = {
            let _shared = source.lock.acquire(1).await;
            source.load(ino_in).await?.0.data_block_bytes()
        };
        // Inside a record of ranges that line up: to its end, where
        // cloning may start. On a boundary (cloning was refused there:
        // other record sizes, another tree) or never lining up: a chunk.
        let within = position_in % record;
        let chunk = if same && within != 0 && within == position_out % record {
            record - within
        } else {
            COPY_CHUNK_BYTES
        };
        let chunk = chunk.min(COPY_CHUNK_BYTES).min(length);
        let data = source
            .read(pool, ino_in, position_in, chunk as usize, false)
            .await?;
        if data.is_empty() {
            // The source was cut meanwhile.
            return Ok(0);
        }
        self.write(pool, ino_out, position_out, &data).await?;
        Ok(data.len() as u64)
    }

    /// Clones the records from `position_in` of `ino_in` to `position_out`
    /// of `ino_out`, up to `length` bytes and [`CLONE_BLOCKS_PER_TURN`]
    /// records, if both positions start a record of the same size; a last
    /// record cut by the source's end is cloned when nothing of the
    /// destination lies past the copy. Returns the bytes cloned (0: none
    /// could be, the caller copies).
    async fn clone_records(
        &self,
        pool: &Rc<Pool>,
        ino_in: u64,
        position_in: u64,
        ino_out: u64,
        position_out: u64,
        length: u64,
    ) -> Result<u64, FsError> {
        pool.txg.throttle(pool).await;
        let _shared = self.lock.acquire(1).await;
        self.check_writable(pool)?;
        let (source, _) = self.load(ino_in).await?;
        let (target, znode_out) = self.load(ino_out).await?;
        if znode_out.is_dir() {
            return Err(FsError::IsDir);
        }
        let record = source.data_block_bytes();
        let Some((records, length)) =
            self.clonable(pool, &source, &target, position_in, position_out, length)
        else {
            return Ok(0);
        };
        let first_in = position_in / record;
        let first_out = position_out / record;
        // Quotas and reservations, as a copy of the records would ask.
        let _admitted = self.admit_write(pool, &target, (records, record)).await?;
        // Whole files, the lower number first (two copies the other way
        // round cannot hold one each).
        let (_first, _second) = if ino_in == ino_out {
            (self.files.whole(ino_in).await, None)
        } else {
            let (low, high) = (ino_in.min(ino_out), ino_in.max(ino_out));
            let low = self.files.whole(low).await;
            (low, Some(self.files.whole(high).await))
        };
        // Writes answered and held in memory are linked first: the source's
        // are what it holds, the destination's are older than the clone.
        self.behind
            .settle_blocks(ino_in, Some(first_in..=first_in + records - 1))
            .await;
        self.behind
            .settle_blocks(ino_out, Some(first_out..=first_out + records - 1))
            .await;
        // The files may have changed while the locks were awaited (the
        // source cut, a block grown).
        let again = self.clonable(pool, &source, &target, position_in, position_out, length);
        if again != Some((records, length)) {
            return Ok(0);
        }
        let shift = source.dnode().data_block_shift;
        if target.dnode().data_block_shift != shift {
            // An empty file takes the source's record size. From here the
            // target changes: a log commit running now must not carry
            // what it read of it.
            self.log.note_unloggable(pool.txg.open());
            let hole = BlockPointer::hole(0, ObjectType::FsFile, 0);
            self.replace_only_block(pool, &target, shift, 0, hole)?;
        }
        let mut cloned = 0;
        let mut failure = None;
        for index in 0..records {
            // The target's length covers each record as it is linked, so a
            // txg built part way has no block past the end.
            let end = position_out + ((index + 1) * record).min(length);
            match self
                .clone_record(
                    pool,
                    &source,
                    first_in + index,
                    &target,
                    first_out + index,
                    end,
                )
                .await
            {
                Ok(true) => cloned += 1,
                // The block reference table is full: the rest is copied.
                Ok(false) => break,
                Err(error) => {
                    failure = Some(error);
                    break;
                }
            }
        }
        if cloned > 0 {
            self.stamp_write(pool, &target)?;
            self.count(|stats| {
                stats.write_ops += 1;
                stats.cloned_blocks += cloned;
            });
        }
        match failure {
            // What was linked stays: a short count.
            Some(error) if cloned == 0 => Err(error),
            _ => Ok((cloned * record).min(length)),
        }
    }

    /// Links block `from` of `source` as block `to` of `target` (a hole
    /// as a hole), and makes the target at least `end` bytes long. False,
    /// with nothing changed, when the block reference table is full.
    async fn clone_record(
        &self,
        pool: &Rc<Pool>,
        source: &Rc<crate::object::Object>,
        from: u64,
        target: &Rc<crate::object::Object>,
        to: u64,
        end: u64,
    ) -> Result<bool, FsError> {
        let pointer = self.objects.block_pointer(source, from).await?;
        self.objects.prepare_link(target, to).await?;
        // No await from here to the link: the source is locked, so its
        // pointer still names its block. The log cannot replay a clone:
        // until its txg is durable, `fsync` commits one, and a log commit
        // running now does not carry what it read of the target.
        self.log.note_unloggable(pool.txg.open());
        let linked = if pointer.is_hole() {
            let hole = BlockPointer::hole(0, ObjectType::FsFile, 0);
            crate::pool::data::link(pool, &self.objects, target, &self.table, to, hole)?;
            true
        } else {
            crate::pool::data::link_clone(pool, &self.objects, target, &self.table, to, pointer)?
        };
        if linked {
            let mut dnode = target.dnode.borrow_mut();
            if end > dnode.length_bytes {
                dnode.length_bytes = end;
            }
            drop(dnode);
            target.dirty.set(true);
        }
        Ok(linked)
    }

    /// How many records from `position_in` of `source` can be cloned to
    /// `position_out` of `target` within `length` bytes, and the bytes they
    /// hold (the source's end cuts `length`); None: none can. Both positions
    /// must start records of one size, the target must not be a file whose
    /// one block grows (the write path reshapes those; an empty target
    /// takes the source's record size), and the block reference table must
    /// have room. A record cut by the source's end counts when the copy
    /// reaches that end and the target holds nothing past the copy (the
    /// record's bytes past the source's end are zeros, and would be the
    /// target's).
    fn clonable(
        &self,
        pool: &Pool,
        source: &crate::object::Object,
        target: &crate::object::Object,
        position_in: u64,
        position_out: u64,
        length: u64,
    ) -> Option<(u64, u64)> {
        let (from, to) = (source.dnode(), target.dnode());
        let record = from.data_block_bytes();
        // An empty file (one hole of any size) takes the source's size.
        let empty = to.levels == 1 && to.length_bytes == 0 && to.root.is_hole();
        if (to.data_block_bytes() != record && !empty)
            || !position_in.is_multiple_of(record)
            || !position_out.is_multiple_of(record)
            || pool.store.clones.borrow().len() >= crate::block::clones::CLONED_BLOCKS_MAX
        {
            return None;
        }
        let length = length.min(from.length_bytes.saturating_sub(position_in));
        let end_out = position_out.checked_add(length)?;
        let mut records = length / record;
        let source_ends = position_in + length == from.length_bytes;
        if length % record != 0 && source_ends && to.length_bytes <= end_out {
            records += 1;
        }
        let records = records.min(CLONE_BLOCKS_PER_TURN);
        let grows = !empty && self.grows(&to, position_out + records * record);
        if records == 0 || grows {
            return None;
        }
        Some((records, length.min(records * record)))
    }
}
#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::rc::Rc;

    use crate::dev::sim::SimDevice;
    use crate::format::label::TopVdevKind;
    use crate::format::znode::S_IFREG;
    use crate::pool::filesystem::{Filesystem, NewObject};
    use crate::pool::test_pool::{named, sim_pool, unhurried};
    use crate::pool::Pool;
    use crate::rt::Runtime;

    const RECORD: usize = 16384;

    fn pattern(length: usize, seed: u8) -> Vec<u8> {
        (0..length)
            .map(|index| (index / 512) as u8 ^ seed.wrapping_mul(31) ^ (index as u8))
            .collect()
    }

    /// Filesystem `tank/fs` of 16K records, uncompressed (so a record's
    /// space is its size), with empty files `a` and `b`.
    async fn fs_with_two_files(pool: &Rc<Pool>) -> (Rc<Filesystem>, u64, u64) {
        let properties = BTreeMap::from([
            ("recordsize".to_string(), "16K".to_string()),
            ("compression".to_string(), "off".to_string()),
        ]);
        let fs = pool.create_filesystem("tank/fs", properties).await.unwrap();
        let mode = NewObject::owned(S_IFREG | 0o644, 0, 0);
        let a = fs.create(pool, fs.root(), b"a", &mode).await.unwrap().ino;
        let b = fs.create(pool, fs.root(), b"b", &mode).await.unwrap().ino;
        (fs, a, b)
    }

    async fn checked(pool: &Rc<Pool>) -> u64 {
        let report = pool.check_space().await.unwrap();
        assert!(report.problems.is_empty(), "{:#?}", report.problems);
        report.allocated_bytes
    }

    /// A clone links the source's records again: the copy reads the same,
    /// takes no data space, survives an export and an import, keeps its
    /// bytes when the source is rewritten, and the space comes back only
    /// with the last reference (through a snapshot's dead list too). The
    /// full check counts each block's links against the table throughout.
    #[test]
    fn cloned_records_share_blocks_until_the_last_reference_goes() {
        let disks: Vec<Rc<SimDevice>> = (0..2)
            .map(|index| SimDevice::new(&format!("d{index}"), 256 << 20, 7 + index))
            .collect();
        let size = 40 * RECORD + 1000;
        let data = pattern(size, 1);
        let expected = data.clone();
        let baseline = Runtime::new_sim(7).block_on({
            let disks = disks.clone();
            async move {
                let pool = sim_pool(&disks, TopVdevKind::Mirror, unhurried()).await;
                let (fs, a, b) = fs_with_two_files(&pool).await;
                let baseline = checked(&pool).await;
                fs.write(&pool, a, 0, &data).await.unwrap();
                let written = checked(&pool).await;
                assert!(written - baseline >= size as u64, "the data");

                let copied = fs
                    .copy_range(&pool, &fs, a, 0, b, 0, u64::MAX)
                    .await
                    .unwrap();
                assert_eq!(copied, size as u64);
                assert_eq!(fs.io_stats().cloned_blocks, 41, "the tail record too");
                assert_eq!(fs.read(&pool, b, 0, size + 10, false).await.unwrap(), data);
                let cloned = checked(&pool).await;
                assert!(
                    cloned - written < size as u64 / 8,
                    "cloned records take no data space: {written} then {cloned}"
                );
                assert_eq!(pool.clone_figures().0, 41);

                // A range that does not line up with records is copied.
                let copied = fs
                    .copy_range(&pool, &fs, a, 100, b, size as u64 + 7, 3 * RECORD as u64)
                    .await
                    .unwrap();
                assert_eq!(copied, 3 * RECORD as u64);
                let tail = fs
                    .read(&pool, b, size as u64 + 7, 3 * RECORD, false)
                    .await
                    .unwrap();
                assert_eq!(tail, data[100..100 + 3 * RECORD]);
                assert_eq!(pool.clone_figures().0, 40, "b's last record was rewritten");
                // A range ending inside a record of a longer source: its
                // whole records are cloned, the rest copied, and nothing of
                // the source shows past the copy's end when it grows.
                let mode = NewObject::owned(S_IFREG | 0o644, 0, 0);
                let c = fs.create(&pool, fs.root(), b"c", &mode).await.unwrap().ino;
                let part = 2 * RECORD as u64 + 1000;
                let cloned_before = fs.io_stats().cloned_blocks;
                let copied = fs.copy_range(&pool, &fs, a, 0, c, 0, part).await.unwrap();
                assert_eq!(copied, part);
                let grow = crate::pool::filesystem::SetAttr {
                    size: Some(4 * RECORD as u64),
                    ..Default::default()
                };
                fs.setattr(&pool, c, grow).await.unwrap();
                let mut want = data[..part as usize].to_vec();
                want.resize(4 * RECORD, 0);
                let grown = fs.read(&pool, c, 0, 8 * RECORD, false).await.unwrap();
                assert!(grown == want, "zeros past the copy's end once it grows");
                assert_eq!(
                    fs.io_stats().cloned_blocks - cloned_before,
                    2,
                    "c's two whole records"
                );
                fs.remove(&pool, fs.root(), b"c", false).await.unwrap();
                checked(&pool).await;
                assert_eq!(pool.clone_figures().0, 40);
                pool.export().await.unwrap();
                baseline
            }
        });
        Runtime::new_sim(8).block_on(async move {
            let pool = Pool::import_from_devices("tank", named(&disks), unhurried())
                .await
                .unwrap();
            assert_eq!(pool.clone_figures().0, 40, "the table came back");
            let fs = pool.filesystem("tank/fs").unwrap();
            let a = fs.lookup(fs.root(), b"a").await.unwrap().ino;
            let b = fs.lookup(fs.root(), b"b").await.unwrap().ino;
            checked(&pool).await;
            // The source rewritten: the copy keeps the bytes it had.
            fs.write(&pool, a, 3 * RECORD as u64, &pattern(RECORD, 9))
                .await
                .unwrap();
            assert_eq!(pool.clone_figures().0, 39);
            let copy = fs.read(&pool, b, 0, size, false).await.unwrap();
            assert_eq!(copy, expected);
            checked(&pool).await;
            // A snapshot holds both files; removed from the head, their
            // blocks go to the dead list, and its destroy frees them all.
            pool.snapshot(&["tank/fs@s".to_string()]).await.unwrap();
            fs.remove(&pool, fs.root(), b"a", false).await.unwrap();
            fs.remove(&pool, fs.root(), b"b", false).await.unwrap();
            checked(&pool).await;
            pool.destroy_snapshot("tank/fs@s").await.unwrap();
            assert_eq!(pool.clone_figures(), (0, 0));
            for _ in 0..3 {
                pool.commit().await.unwrap();
            }
            let end = checked(&pool).await;
            // (The pool's metadata grew meanwhile: space logs, the table.)
            assert!(
                end < baseline + size as u64 / 4,
                "the space came back: {baseline} before, {end} after"
            );
        });
    }

    /// `cp a b` in a filesystem and in its clone, in one txg: the two links
    /// of each block differ only by the dataset they were made in, and the
    /// full check counts both against the table (it once took them for one
    /// and called a healthy pool damaged).
    #[test]
    fn the_same_copy_in_a_filesystem_and_its_clone_is_two_links() {
        let disks: Vec<Rc<SimDevice>> = (0..2)
            .map(|index| SimDevice::new(&format!("d{index}"), 256 << 20, 17 + index))
            .collect();
        Runtime::new_sim(17).block_on(async move {
            let pool = sim_pool(&disks, TopVdevKind::Mirror, unhurried()).await;
            let (fs, a, b) = fs_with_two_files(&pool).await;
            fs.write(&pool, a, 0, &pattern(4 * RECORD, 3))
                .await
                .unwrap();
            pool.snapshot(&["tank/fs@s".to_string()]).await.unwrap();
            let clone = pool
                .clone_filesystem("tank/fs@s", "tank/c", Default::default())
                .await
                .unwrap();
            let txg = pool.txg.open();
            let whole = u64::MAX >> 8;
            fs.copy_range(&pool, &fs, a, 0, b, 0, whole).await.unwrap();
            clone
                .copy_range(&pool, &clone, a, 0, b, 0, whole)
                .await
                .unwrap();
            assert_eq!(pool.txg.open(), txg, "both copies in one txg");
            assert_eq!(pool.clone_figures(), (4, 8 * RECORD as u64));
            checked(&pool).await;
        });
    }
}
