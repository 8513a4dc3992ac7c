//! Group commit of the intent log on simulated devices, with every I/O taking
//! a fixed time so that the order of concurrent commits is set by the test:
//! a caller may return on a commit another caller started, but only one that
//! covers everything it needs.

mod sim_support;

use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use ironpool::dev::sim::{SimDevice, SimLatency};
use ironpool::format::label::TopVdevKind;
use ironpool::pool::dataset::intent_log::LOG_AHEAD_STREAK;
use ironpool::pool::volume::{ReadPiece, Volume};
use ironpool::pool::{NewTopVdev, Pool, PoolTunables};
use ironpool::rt::sim::Rng;
use ironpool::rt::{self, Runtime};
use sim_support::{crash_all, devices, layout, manual_commits, named, random_pattern};

const DEVICE_BYTES: u64 = 128 << 20;
const VOLUME_BYTES: u64 = 32 << 20;
const BLOCK: u64 = 16384;
/// Every device I/O takes this long: the steps below are spaced by it.
const IO_US: u64 = 1000;

fn steps(count: u64) -> Duration {
    Duration::from_micros(count * IO_US)
}

/// A pool of `tops` with one volume.
async fn pool_with_volume(tops: Vec<NewTopVdev>, tunables: PoolTunables) -> (Rc<Pool>, Rc<Volume>) {
    let pool = Pool::create_on_devices("tank", tops, false, tunables)
        .await
        .unwrap();
    pool.create_volume("tank/vol", VOLUME_BYTES, BLOCK as u32, BTreeMap::new())
        .await
        .unwrap();
    let volume = pool.volume("tank/vol").unwrap();
    (pool, volume)
}

/// A mirror of `disks` with one volume, commits only when asked.
async fn mirror_with_volume(disks: &[Rc<SimDevice>]) -> (Rc<Pool>, Rc<Volume>) {
    pool_with_volume(layout(disks, TopVdevKind::Mirror), manual_commits()).await
}

/// A mirror of the first two of `disks` and a log device on the third.
fn mirror_and_log(disks: &[Rc<SimDevice>]) -> Vec<NewTopVdev> {
    let mut tops = layout(&disks[..2], TopVdevKind::Mirror);
    let mut log = layout(&disks[2..], TopVdevKind::Disk);
    log[0].log = true;
    tops.extend(log);
    tops
}

/// The mirror on `disks` imported after a crash, commits only when asked,
/// and its volume.
async fn import_crashed(disks: &[Rc<SimDevice>]) -> (Rc<Pool>, Rc<Volume>) {
    let pool = Pool::import_from_devices("tank", named(disks), manual_commits())
        .await
        .unwrap();
    let volume = pool.volume("tank/vol").unwrap();
    (pool, volume)
}

/// Asserts that each of `blocks` of `volume` holds
/// `random_pattern(BLOCK, tag + blkid)`; `lost` says which write a failure is.
async fn assert_blocks(
    pool: &Rc<Pool>,
    volume: &Rc<Volume>,
    blocks: impl IntoIterator<Item = u64>,
    tag: u64,
    lost: &str,
) {
    for blkid in blocks {
        let read = ReadPiece::concat(pool.read(volume, blkid * BLOCK, BLOCK).await.unwrap());
        assert!(
            read == random_pattern(BLOCK as usize, tag + blkid).to_vec(),
            "{lost} {blkid} lost"
        );
    }
}

/// Every I/O of `disks` takes between `minimum_us` and `maximum_us`, no spikes.
fn set_latency(disks: &[Rc<SimDevice>], minimum_us: u64, maximum_us: u64) {
    for disk in disks {
        disk.set_latency(SimLatency {
            minimum_us,
            maximum_us,
            spike_every: 0,
            spike_us: 0,
        });
    }
}

/// A FLUSH whose held block is small enough to copy arrives while a FLUSH
/// of many held blocks (written out before the commit lock, so its commit
/// logs linked blocks only) waits behind a FUA write's commit. The big
/// FLUSH's commit starts after the small one arrived, yet does not take the
/// small one's held block: the small FLUSH must not return on it. After it
/// returns, the power goes, and the block must be there.
#[test]
fn a_flush_does_not_return_on_a_later_commit_that_left_its_held_block_out() {
    let disks = devices(2, DEVICE_BYTES, 11);
    let late = random_pattern(BLOCK as usize, 777);
    let expected = late.to_vec();
    let first = disks.clone();
    Runtime::new_sim(11).block_on(async move {
        let disks = first;
        let (pool, volume) = mirror_with_volume(&disks).await;
        // The volume's first FLUSH starts its log chain through a txg.
        pool.write(&volume, 0, random_pattern(BLOCK as usize, 1), false)
            .await
            .unwrap();
        pool.flush_volume(&volume).await.unwrap();
        set_latency(&disks, IO_US, IO_US);
        // C0: a FUA write; its commit holds the lock from step 1 to about 3.
        let fua = {
            let (pool, volume) = (pool.clone(), volume.clone());
            rt::spawn(async move {
                pool.write(
                    &volume,
                    100 * BLOCK,
                    random_pattern(BLOCK as usize, 2),
                    true,
                )
                .await
            })
        };
        rt::sleep(steps(1) / 2).await;
        // A: eight held blocks, too many to copy: its FLUSH writes them out
        // (done at step 1.5) and waits for the lock behind C0.
        for blkid in 10..18 {
            pool.write(
                &volume,
                blkid * BLOCK,
                random_pattern(BLOCK as usize, blkid),
                false,
            )
            .await
            .unwrap();
        }
        let big_flush = {
            let (pool, volume) = (pool.clone(), volume.clone());
            rt::spawn(async move { pool.flush_volume(&volume).await })
        };
        rt::sleep(steps(2) - steps(1) / 2).await;
        // Step 2: one block held after A's write-out, and its FLUSH.
        pool.write(&volume, 50 * BLOCK, late.clone(), false)
            .await
            .unwrap();
        pool.flush_volume(&volume).await.unwrap();
        // The power goes the moment the small FLUSH returns.
        crash_all(&disks, &mut Rng::new(5));
        drop((fua, big_flush));
    });
    Runtime::new_sim(12).block_on(async move {
        let (pool, volume) = import_crashed(&disks).await;
        let read = ReadPiece::concat(pool.read(&volume, 50 * BLOCK, BLOCK).await.unwrap());
        assert!(
            read == expected,
            "a write whose FLUSH returned was lost: the FLUSH returned on a commit that did not log it"
        );
        pool.export().await.unwrap();
    });
}

/// 32 writers, each doing 8 FUA writes one after the other (a client at
/// queue depth 32), on devices whose latency varies: writes arrive one by one
/// while a commit is in flight. A writer that finds a commit which started
/// after its write was linked returns on it; without that, each waiter in
/// turn committed the one write that had arrived meanwhile (one record per
/// commit: 256 commits). Every write is there after the power goes.
#[test]
fn streams_of_fua_writes_share_commits_and_survive_a_crash() {
    const WRITERS: u64 = 32;
    const WRITES_EACH: u64 = 8;
    let disks = devices(2, DEVICE_BYTES, 13);
    let first = disks.clone();
    Runtime::new_sim(13).block_on(async move {
        let disks = first;
        let (pool, volume) = mirror_with_volume(&disks).await;
        pool.write(&volume, 0, random_pattern(BLOCK as usize, 1), true)
            .await
            .unwrap();
        set_latency(&disks, IO_US / 2, IO_US * 3 / 2);
        let before = volume.log_stats();
        let writers: Vec<_> = (0..WRITERS)
            .map(|writer| {
                let (pool, volume) = (pool.clone(), volume.clone());
                rt::spawn(async move {
                    for round in 0..WRITES_EACH {
                        let blkid = 1 + writer * WRITES_EACH + round;
                        let data = random_pattern(BLOCK as usize, 100 + blkid);
                        pool.write(&volume, blkid * BLOCK, data, true).await?;
                    }
                    Ok::<(), ironpool::pool::PoolError>(())
                })
            })
            .collect();
        for writer in writers {
            writer.await.unwrap();
        }
        let after = volume.log_stats();
        let commits = after.commits - before.commits;
        let total = WRITERS * WRITES_EACH;
        assert!(
            commits <= total / 4,
            "{total} FUA writes from {WRITERS} writers took {commits} log commits"
        );
        crash_all(&disks, &mut Rng::new(6));
    });
    Runtime::new_sim(14).block_on(async move {
        let (pool, volume) = import_crashed(&disks).await;
        assert_blocks(&pool, &volume, 1..=WRITERS * WRITES_EACH, 100, "FUA write").await;
        pool.export().await.unwrap();
    });
}

/// Four FUA writes a quarter step apart on a pool with a log device: their
/// commits are in flight together (`log_commits_in_flight` 4). The log
/// device fails for the moment the second commit's block completes, and is
/// back before the third's and fourth's: their own blocks are written, but
/// the chain has a gap before them, so they must not be answered through
/// it. They fall back to a txg; the first is answered through the log.
/// Every write is there after the power goes.
#[test]
fn a_failed_log_write_fails_the_commits_in_flight_behind_it() {
    let disks = devices(3, DEVICE_BYTES, 15);
    let first = disks.clone();
    Runtime::new_sim(15).block_on(async move {
        let disks = first;
        let tunables = PoolTunables {
            log_commits_in_flight: 4,
            ..manual_commits()
        };
        let (pool, volume) = pool_with_volume(mirror_and_log(&disks), tunables).await;
        // The volume's first FLUSH starts its log chain through a txg.
        pool.write(&volume, 0, random_pattern(BLOCK as usize, 1), true)
            .await
            .unwrap();
        set_latency(&disks, IO_US, IO_US);
        let before = volume.log_stats();
        let log_device = disks[2].counters();
        let writers: Vec<_> = (0..4u64)
            .map(|index| {
                let (pool, volume) = (pool.clone(), volume.clone());
                rt::spawn(async move {
                    rt::sleep(steps(index) / 4).await;
                    let data = random_pattern(BLOCK as usize, 200 + index);
                    pool.write(&volume, (10 + index) * BLOCK, data, true).await
                })
            })
            .collect();
        // Commit 1's block completes at step 1, commit 2's at 1.25, commit
        // 3's at 1.5 and commit 4's at 1.75.
        rt::sleep(steps(1) + steps(1) / 10).await;
        disks[2].set_offline(true);
        rt::sleep(steps(1) / 4).await;
        disks[2].set_offline(false);
        for writer in writers {
            writer.await.unwrap();
        }
        let after = volume.log_stats();
        let log_after = disks[2].counters();
        assert_eq!(
            log_after.offline_errors - log_device.offline_errors,
            1,
            "only the second commit's log block fails"
        );
        assert!(
            log_after.durable_writes - log_device.durable_writes >= 4,
            "the four commits' log blocks were written side by side"
        );
        assert_eq!(after.commits - before.commits, 1, "the first commit");
        assert!(
            after.txg_fallbacks - before.txg_fallbacks >= 3,
            "the second commit and the two behind it went through a txg ({:?})",
            after
        );
        crash_all(&disks, &mut Rng::new(7));
    });
    Runtime::new_sim(16).block_on(async move {
        let (pool, volume) = import_crashed(&disks).await;
        for index in 0..4u64 {
            let read = ReadPiece::concat(
                pool.read(&volume, (10 + index) * BLOCK, BLOCK)
                    .await
                    .unwrap(),
            );
            assert!(
                read == random_pattern(BLOCK as usize, 200 + index).to_vec(),
                "FUA write {index} lost"
            );
        }
        pool.export().await.unwrap();
    });
}

/// A small FUA write is held and copied into the log; a FUA write too large
/// to copy is then written through over the same blocks (it replaces the
/// held copy). Its commit must log the new blocks: the link of bytes newer
/// than a copy in the log is a change like any other. It was taken for the
/// write-back writing the copied bytes out, so no record was written, the
/// FUA write was answered, and after a crash replay brought the older copy
/// back (found by ironpool-sim seed 5, mirror3, a burst of FUA writes).
#[test]
fn a_write_through_over_a_copied_block_is_logged() {
    let disks = devices(2, DEVICE_BYTES, 17);
    let newer = random_pattern(3 * BLOCK as usize, 402);
    let expected = newer.to_vec();
    let first = disks.clone();
    Runtime::new_sim(17).block_on(async move {
        let disks = first;
        let (pool, volume) = mirror_with_volume(&disks).await;
        // The volume's first FLUSH starts its log chain through a txg.
        pool.write(&volume, 0, random_pattern(BLOCK as usize, 1), true)
            .await
            .unwrap();
        let before = volume.log_stats();
        // Held and copied: one block, small enough.
        pool.write(
            &volume,
            20 * BLOCK,
            random_pattern(BLOCK as usize, 401),
            true,
        )
        .await
        .unwrap();
        assert_eq!(
            volume.log_stats().copied_blocks - before.copied_blocks,
            1,
            "the small FUA write's block is copied into the log"
        );
        // 48 KiB: written through, over the held block and two more.
        pool.write(&volume, 20 * BLOCK, newer.clone(), true)
            .await
            .unwrap();
        crash_all(&disks, &mut Rng::new(8));
    });
    Runtime::new_sim(18).block_on(async move {
        let (pool, volume) = import_crashed(&disks).await;
        let read = ReadPiece::concat(pool.read(&volume, 20 * BLOCK, 3 * BLOCK).await.unwrap());
        assert!(
            read == expected,
            "a FUA write written through over a copied block was lost"
        );
        pool.export().await.unwrap();
    });
}

/// The block of the write logged ahead by the tests below: blocks
/// `0..AHEAD_BLKID` are those of the writes, each followed by a FLUSH,
/// that set up the pattern.
const AHEAD_BLKID: u64 = LOG_AHEAD_STREAK as u64 + 1;

/// The pool of `disks` ([`mirror_and_log`]) with a volume whose client has
/// flushed after each single write lately: its next lone write is logged
/// ahead of its FLUSH. Blocks `0..AHEAD_BLKID` hold
/// `random_pattern(BLOCK, 500 + blkid)`.
async fn flushing_after_each_write(
    disks: &[Rc<SimDevice>],
    tunables: PoolTunables,
) -> (Rc<Pool>, Rc<Volume>) {
    let (pool, volume) = pool_with_volume(mirror_and_log(disks), tunables).await;
    for blkid in 0..AHEAD_BLKID {
        let data = random_pattern(BLOCK as usize, 500 + blkid);
        pool.write(&volume, blkid * BLOCK, data, false)
            .await
            .unwrap();
        pool.flush_volume(&volume).await.unwrap();
    }
    (pool, volume)
}

/// Sends the next write of [`flushing_after_each_write`]'s client, block
/// [`AHEAD_BLKID`], and starts its commit ahead of the FLUSH as the
/// NBD engine does once the WRITE is answered (`Pool::log_ahead`, spawned),
/// with the log device `slow_log_steps` times slower than the mirror.
async fn write_and_log_ahead(
    pool: &Rc<Pool>,
    volume: &Rc<Volume>,
    disks: &[Rc<SimDevice>],
    slow_log_steps: u64,
) {
    set_latency(&disks[..2], IO_US, IO_US);
    set_latency(&disks[2..], IO_US * slow_log_steps, IO_US * slow_log_steps);
    let data = random_pattern(BLOCK as usize, 500 + AHEAD_BLKID);
    pool.write(volume, AHEAD_BLKID * BLOCK, data, false)
        .await
        .unwrap();
    let (pool, volume) = (pool.clone(), volume.clone());
    rt::spawn(async move { pool.log_ahead(&volume).await });
}

/// Such a client's next write is answered and its commit started ahead of
/// its FLUSH (`Pool::log_ahead`, as the NBD engine does), with the log
/// device 50 times slower than the mirror; then the pool is exported: one
/// pool for each moment from the write to past the end of that log write,
/// a step apart. However far the commit got, the export waits for it: it
/// has ended when the export returns, no device completes a write after
/// that, and a write sent during the export is refused (before, one taken
/// late in an export was lost: its block was written out after the final
/// txg). At the next import every answered write is there. Only that log
/// write is slow: the log device answers the export's own I/O at once, so
/// the export cannot wait for the commit by queueing behind its write.
/// Without `Pool::quiesce_logs` the export returns first and the log device
/// completes the commit's write after it (found so: the test had let the
/// export's writes queue behind the slow one, and passed without it).
#[test]
fn an_export_waits_for_a_commit_started_ahead() {
    const SLOW_LOG_STEPS: u64 = 50;
    const MOMENTS: u64 = 60;
    for moment in 0..MOMENTS {
        let seed = 1000 + moment;
        let disks = devices(3, DEVICE_BYTES, seed);
        let first = disks.clone();
        Runtime::new_sim(seed).block_on(async move {
            let disks = first;
            let (pool, volume) = flushing_after_each_write(&disks, manual_commits()).await;
            let before = volume.log_stats().ahead_commits;
            write_and_log_ahead(&pool, &volume, &disks, SLOW_LOG_STEPS).await;
            // The commit's log write is sent with the slow latency; what the
            // export sends the log device after it completes at once, so
            // the export's own I/O does not queue behind that write.
            rt::sleep(steps(1)).await;
            set_latency(&disks[2..], IO_US, IO_US);
            rt::sleep(steps(moment)).await;
            let export = {
                let pool = pool.clone();
                rt::spawn(async move { pool.export().await })
            };
            rt::yield_now().await;
            let late = pool
                .write(&volume, 0, random_pattern(BLOCK as usize, 1), false)
                .await;
            assert!(
                matches!(late, Err(ironpool::pool::PoolError::Closing)),
                "a write during the export: {late:?}"
            );
            export.await.unwrap();
            assert_eq!(
                volume.log_stats().ahead_commits - before,
                1,
                "the commit started ahead had ended when the export {moment} steps later returned"
            );
            let written: Vec<_> = disks.iter().map(|disk| disk.counters().writes).collect();
            rt::sleep(steps(2 * SLOW_LOG_STEPS)).await;
            let later: Vec<_> = disks.iter().map(|disk| disk.counters().writes).collect();
            assert_eq!(
                written, later,
                "a device completed a write after the export {moment} steps later"
            );
        });
        Runtime::new_sim(seed + 1).block_on(async move {
            let pool = Pool::import_from_devices("tank", named(&disks), manual_commits())
                .await
                .unwrap();
            let volume = pool.volume("tank/vol").unwrap();
            let lost = format!("(export {moment} steps after the last) write");
            assert_blocks(&pool, &volume, 0..=AHEAD_BLKID, 500, &lost).await;
            pool.export().await.unwrap();
        });
    }
}

/// Such a client's write is answered and its commit started ahead, and its
/// FLUSH comes while that commit's log write is in flight, with two commits
/// allowed in flight: the FLUSH's own commit finds nothing left to log and
/// must wait for the one in flight before it answers. Then the power goes:
/// the write is there (engine_sim's lone client meets this window too
/// rarely to catch a FLUSH answered early).
#[test]
fn a_flush_waits_for_the_commit_started_ahead_of_it() {
    const SLOW_LOG_STEPS: u64 = 10;
    let disks = devices(3, DEVICE_BYTES, 21);
    let first = disks.clone();
    Runtime::new_sim(21).block_on(async move {
        let disks = first;
        let tunables = PoolTunables {
            log_commits_in_flight: 2,
            ..manual_commits()
        };
        let (pool, volume) = flushing_after_each_write(&disks, tunables).await;
        let before = volume.log_stats();
        write_and_log_ahead(&pool, &volume, &disks, SLOW_LOG_STEPS).await;
        // The commit takes the held block and sends its log block.
        rt::yield_now().await;
        let flushed_at = rt::now();
        pool.flush_volume(&volume).await.unwrap();
        let waited = rt::now().duration_since(flushed_at);
        let after = volume.log_stats();
        assert_eq!(
            after.ahead_commits - before.ahead_commits,
            1,
            "the FLUSH returned after {waited:?}, before the commit started ahead ended"
        );
        assert_eq!(
            after.shared_commits - before.shared_commits,
            1,
            "the FLUSH was answered by the commit started ahead"
        );
        crash_all(&disks, &mut Rng::new(8));
    });
    Runtime::new_sim(22).block_on(async move {
        let (pool, volume) = import_crashed(&disks).await;
        assert_blocks(&pool, &volume, 0..=AHEAD_BLKID, 500, "flushed write").await;
        pool.export().await.unwrap();
    });
}
