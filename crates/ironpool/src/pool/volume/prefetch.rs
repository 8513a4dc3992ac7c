//! Prefetch (OpenZFS's zfetch): sequential readers of a volume are found,
//! several at once, and the blocks ahead of each are read into the cache
//! before it asks, at a distance that grows while the stream goes on.
//!
//! A stream is a run of reads each starting where the last ended (or inside
//! the block it ended in: 4K reads of a 16K block). Its second advancing
//! read confirms it and starts the read-ahead at
//! [`PREFETCH_DISTANCE_MIN_BYTES`] (or twice the read, if larger); each
//! further read doubles the distance up to [`PREFETCH_DISTANCE_MAX_BYTES`].
//! Prefetched blocks enter the cache as unread (see [`crate::cache::arc`]):
//! they evict themselves first if no one reads them, and those are counted.

use std::cell::{Cell, RefCell};
use std::ops::Range;
use std::rc::Rc;

use crate::pool::volume::Volume;
use crate::pool::Pool;
use crate::queue::IoClass;
use crate::rt::sync::Notify;

/// Streams followed per volume: several readers at once (a copy and a
/// scan, or the stripes of a sequential reader at queue depth).
pub const PREFETCH_STREAMS_MAX: usize = 8;
/// First read-ahead distance of a confirmed stream.
pub const PREFETCH_DISTANCE_MIN_BYTES: u64 = 256 << 10;
/// Farthest read-ahead of one stream: enough for a 1 MiB sequential reader at
/// QD1 to find its next eight requests cached, small enough that a reader
/// that stops wastes little.
pub const PREFETCH_DISTANCE_MAX_BYTES: u64 = 8 << 20;
/// Prefetch bytes in flight in the whole pool: a bound on the buffers read
/// ahead and not yet in the cache, and on the share of the devices prefetch
/// takes from demand reads.
pub const PREFETCH_IN_FLIGHT_BYTES_MAX: u64 = 64 << 20;
/// A confirmed stream keeps its place this long after its last read; an
/// unconfirmed one (a random read that looked like a start) is replaced
/// first.
pub const STREAM_IDLE_NS: u64 = 2_000_000_000;
/// Blocks one prefetch task reads at once.
const PREFETCH_BLOCKS_AT_ONCE: usize = 32;

#[derive(Clone, Copy, Debug)]
struct Stream {
    /// The block after the stream's last read.
    next: u64,
    /// Blocks before this are read or being read ahead.
    ahead: u64,
    /// Read-ahead distance in blocks (0: not confirmed yet).
    distance: u64,
    last_ns: u64,
}

/// The streams of one volume.
#[derive(Default)]
pub struct Streams {
    streams: RefCell<Vec<Stream>>,
}

impl Streams {
    /// Notes a demand read of blocks `first..=last` at `now_ns`; returns the
    /// blocks to read ahead, if any (not clamped to the volume's end).
    pub fn on_read(
        &self,
        first: u64,
        last: u64,
        block_bytes: u64,
        now_ns: u64,
    ) -> Option<Range<u64>> {
        let mut streams = self.streams.borrow_mut();
        let found = streams
            .iter_mut()
            .find(|stream| first <= stream.next && stream.next <= last + 1);
        let Some(stream) = found else {
            let new = Stream {
                next: last + 1,
                ahead: last + 1,
                distance: 0,
                last_ns: now_ns,
            };
            if streams.len() < PREFETCH_STREAMS_MAX {
                streams.push(new);
            } else if let Some(victim) = streams
                .iter_mut()
                .filter(|stream| {
                    stream.distance == 0 || now_ns.saturating_sub(stream.last_ns) >= STREAM_IDLE_NS
                })
                .min_by_key(|stream| stream.last_ns)
            {
                *victim = new;
            }
            return None;
        };
        stream.last_ns = now_ns;
        if last < stream.next {
            // The same block again (a partial read): no progress.
            return None;
        }
        stream.next = last + 1;
        let min_blocks = (PREFETCH_DISTANCE_MIN_BYTES / block_bytes).max(1);
        let max_blocks = (PREFETCH_DISTANCE_MAX_BYTES / block_bytes).max(1);
        let read_blocks = last - first + 1;
        stream.distance = if stream.distance == 0 {
            min_blocks.max(2 * read_blocks)
        } else {
            stream.distance * 2
        }
        .min(max_blocks);
        let start = stream.ahead.max(stream.next);
        let end = stream.next + stream.distance;
        if end <= start {
            return None;
        }
        stream.ahead = end;
        Some(start..end)
    }

    /// Lets a stream read ahead `blocks` again (their prefetch was not
    /// issued: the pool's bound was reached).
    fn give_back(&self, blocks: Range<u64>) {
        for stream in self.streams.borrow_mut().iter_mut() {
            if stream.ahead == blocks.end {
                stream.ahead = blocks.start.max(stream.next);
            }
        }
    }
}

/// The pool's prefetches in flight.
#[derive(Default)]
pub struct PrefetchState {
    in_flight_bytes: Cell<u64>,
    tasks: Cell<u64>,
    done: Notify,
    stopped: Cell<bool>,
    /// Blocks prefetched (read ahead into the cache).
    issued_blocks: Cell<u64>,
    /// Read-aheads not issued because the pool's bound was reached.
    throttled: Cell<u64>,
}

impl PrefetchState {
    /// Stops new prefetches and waits for those in flight (export).
    pub async fn stop(&self) {
        self.stopped.set(true);
        while self.tasks.get() > 0 {
            self.done.notified().await;
        }
    }

    /// (blocks prefetched, read-aheads throttled) since import.
    pub fn counters(&self) -> (u64, u64) {
        (self.issued_blocks.get(), self.throttled.get())
    }
}

impl Pool {
    /// (blocks prefetched, read-aheads throttled) since import.
    pub fn prefetch_counters(&self) -> (u64, u64) {
        self.prefetch.counters()
    }

    /// Follows a demand read of `volume`'s blocks `first..=last`, and reads
    /// ahead of it if it continues a stream.
    pub(crate) fn prefetch_after_read(self: &Rc<Self>, volume: &Rc<Volume>, first: u64, last: u64) {
        let usage = volume.settings().data_cache_use();
        if !usage.keep || self.prefetch.stopped.get() {
            return;
        }
        let block = volume.block_bytes;
        let Some(blocks) = volume
            .streams
            .on_read(first, last, block, crate::rt::now().0)
        else {
            return;
        };
        let volume_blocks = volume.size_bytes.get().div_ceil(block);
        let blocks = blocks.start.min(volume_blocks)..blocks.end.min(volume_blocks);
        if blocks.is_empty() {
            return;
        }
        let bytes = (blocks.end - blocks.start) * block;
        let state = &self.prefetch;
        if state.in_flight_bytes.get() + bytes > PREFETCH_IN_FLIGHT_BYTES_MAX {
            state.throttled.set(state.throttled.get() + 1);
            volume.streams.give_back(blocks);
            return;
        }
        state
            .in_flight_bytes
            .set(state.in_flight_bytes.get() + bytes);
        state.tasks.set(state.tasks.get() + 1);
        let pool = self.clone();
        let volume = volume.clone();
        crate::rt::spawn(async move {
            let usage = usage.prefetch();
            let all: Vec<u64> = blocks.collect();
            for chunk in all.chunks(PREFETCH_BLOCKS_AT_ONCE) {
                let reads = chunk.iter().map(|&blkid| {
                    let pool = &pool;
                    let volume = &volume;
                    async move {
                        if volume.writeback.lookup(blkid).is_some() {
                            return;
                        }
                        let Ok(pointer) = pool.objects.block_pointer(&volume.object, blkid).await
                        else {
                            return;
                        };
                        if pointer.is_hole() {
                            return;
                        }
                        // A failed prefetch costs nothing: the demand read
                        // will read (and report) for itself. In the sync
                        // read class: the reader waits for these blocks
                        // next (OpenZFS raises a prefetch a reader waits
                        // for to sync priority; this queue cannot, and in
                        // the async class, capped low, the reader waited
                        // behind them: 1M sequential reads at QD1 fell
                        // from about 960 to 320-870 MiB/s).
                        let _ = pool
                            .store
                            .read_cached(&pointer, IoClass::SyncRead, usage)
                            .await;
                    }
                });
                futures_util::future::join_all(reads).await;
                pool.prefetch
                    .issued_blocks
                    .set(pool.prefetch.issued_blocks.get() + chunk.len() as u64);
            }
            let state = &pool.prefetch;
            state
                .in_flight_bytes
                .set(state.in_flight_bytes.get() - bytes);
            state.tasks.set(state.tasks.get() - 1);
            state.done.notify_all();
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOCK: u64 = 16 << 10;

    #[test]
    fn a_stream_is_confirmed_by_its_second_read_and_its_distance_doubles() {
        let streams = Streams::default();
        // 1 MiB reads of 16K blocks: 64 blocks each.
        assert_eq!(streams.on_read(0, 63, BLOCK, 0), None);
        assert_eq!(streams.on_read(64, 127, BLOCK, 1), Some(128..256));
        assert_eq!(streams.on_read(128, 191, BLOCK, 2), Some(256..448));
        let max_blocks = PREFETCH_DISTANCE_MAX_BYTES / BLOCK;
        let mut next = 192;
        for _ in 0..10 {
            streams.on_read(next, next + 63, BLOCK, 3);
            next += 64;
        }
        let ahead = streams.on_read(next, next + 63, BLOCK, 4).unwrap();
        assert_eq!(
            ahead.end,
            next + 64 + max_blocks,
            "capped at the maximum distance"
        );
    }

    #[test]
    fn partial_reads_of_one_block_neither_break_nor_advance_a_stream() {
        let streams = Streams::default();
        assert_eq!(streams.on_read(10, 10, BLOCK, 0), None);
        assert_eq!(streams.on_read(10, 10, BLOCK, 0), None);
        let min_blocks = PREFETCH_DISTANCE_MIN_BYTES / BLOCK;
        assert_eq!(streams.on_read(11, 11, BLOCK, 0), Some(12..12 + min_blocks));
        assert_eq!(streams.borrow_len(), 1);
    }

    #[test]
    fn random_reads_do_not_push_out_a_confirmed_stream() {
        let streams = Streams::default();
        streams.on_read(0, 0, BLOCK, 0);
        assert!(streams.on_read(1, 1, BLOCK, 1).is_some());
        for random in 0..100 {
            assert_eq!(
                streams.on_read(10_000 + random * 7, 10_000 + random * 7, BLOCK, 2),
                None
            );
        }
        assert!(
            streams.on_read(2, 2, BLOCK, 3).is_some(),
            "the stream survived"
        );
    }

    impl Streams {
        fn borrow_len(&self) -> usize {
            self.streams.borrow().len()
        }
    }
}
