//! Trim on simulated devices: autotrim discards the space a destroy freed
//! once it leaves the defer window, `trim` discards all free space, every
//! live block survives both (and a crash after them) on a mirror and on
//! RAID-Z, and a device without discard is reported once and never failed.

mod sim_support;

use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use ironpool::dev::sim::SimDevice;
use ironpool::format::label::TopVdevKind;
use ironpool::pool::volume::ReadPiece;
use ironpool::pool::Pool;
use ironpool::rt::sim::Rng;
use ironpool::rt::Runtime;
use sim_support::{
    crash_all, devices, layout, manual_commits, manual_mirror, named, random_pattern,
};

const DEVICE_BYTES: u64 = 256 << 20;
const VOLUME_BYTES: u64 = 16 << 20;
const BLOCK: u64 = 16384;

/// Fills volume `name` with blocks tagged by `tag` and the block number.
async fn fill(pool: &Rc<Pool>, name: &str, tag: u64) {
    let volume = pool.volume(name).unwrap();
    for blkid in 0..VOLUME_BYTES / BLOCK {
        pool.write(
            &volume,
            blkid * BLOCK,
            random_pattern(BLOCK as usize, tag + blkid),
            false,
        )
        .await
        .unwrap();
    }
}

async fn assert_filled(pool: &Rc<Pool>, name: &str, tag: u64) {
    let volume = pool.volume(name).unwrap();
    for blkid in 0..VOLUME_BYTES / BLOCK {
        let bytes = ReadPiece::concat(pool.read(&volume, blkid * BLOCK, BLOCK).await.unwrap());
        assert!(
            bytes == *random_pattern(BLOCK as usize, tag + blkid),
            "{name} block {blkid} changed"
        );
    }
}

/// Autotrim runs in the background: lets it finish (a second of virtual
/// time at most).
async fn wait_for_autotrim(pool: &Rc<Pool>) {
    for _ in 0..1000 {
        if !pool.trim_status().autotrim_running {
            return;
        }
        ironpool::rt::sleep(Duration::from_millis(1)).await;
    }
}

fn trims(disks: &[Rc<SimDevice>]) -> u64 {
    disks.iter().map(|disk| disk.counters().trims).sum()
}

/// Two volumes written, one destroyed: after the commits that take its
/// frees past the defer window, autotrim has discarded them; a trim of all
/// free space discards the rest; the other volume reads back intact, also
/// after a crash and an import.
fn destroy_trim_crash_and_read_back(kind: TopVdevKind, count: usize, seed: u64) {
    let disks = devices(count, DEVICE_BYTES, seed);
    let mut rng = Rng::new(seed);
    Runtime::new_sim(seed).block_on(async {
        let pool = Pool::create_on_devices("tank", layout(&disks, kind), false, manual_commits())
            .await
            .unwrap();
        let on = BTreeMap::from([("autotrim".to_string(), "on".to_string())]);
        pool.set_properties("tank", &on).await.unwrap();
        for name in ["tank/keep", "tank/gone"] {
            pool.create_volume(name, VOLUME_BYTES, BLOCK as u32, BTreeMap::new())
                .await
                .unwrap();
        }
        fill(&pool, "tank/keep", 1 << 20).await;
        fill(&pool, "tank/gone", 2 << 20).await;
        pool.flush_all().await.unwrap();
        let before = trims(&disks);
        pool.destroy_volume("tank/gone", false).await.unwrap();
        // The destroy's txg, then the two that take its frees past the
        // defer window.
        for _ in 0..4 {
            pool.commit().await.unwrap();
        }
        wait_for_autotrim(&pool).await;
        let status = pool.trim_status();
        assert!(
            status.autotrim_extents > 0 && status.autotrim_trimmed_bytes >= VOLUME_BYTES,
            "autotrim did not discard the destroyed volume: {status:?}"
        );
        assert!(trims(&disks) > before);
        pool.trim_start().unwrap();
        pool.trim_wait().await;
        let status = pool.trim_status();
        assert_eq!(status.state, "finished", "{status:?}");
        assert!(status.trimmed_bytes > 0, "{status:?}");
        assert_filled(&pool, "tank/keep", 1 << 20).await;
        let report = pool.check_space().await.unwrap();
        assert!(report.problems.is_empty(), "{:?}", report.problems);
        // Discards the devices took but did not flush may or may not stay.
        crash_all(&disks, &mut rng);
    });
    Runtime::new_sim(seed + 1).block_on(async {
        let pool = Pool::import_from_devices("tank", named(&disks), manual_commits())
            .await
            .unwrap();
        assert_filled(&pool, "tank/keep", 1 << 20).await;
        assert!(pool.volume("tank/gone").is_err());
        let report = pool.check_space().await.unwrap();
        assert!(report.problems.is_empty(), "{:?}", report.problems);
        pool.export().await.unwrap();
    });
}

#[test]
fn a_mirror_discards_what_a_destroy_freed_and_keeps_every_live_block() {
    destroy_trim_crash_and_read_back(TopVdevKind::Mirror, 2, 11);
}

#[test]
fn raidz_discards_only_free_sectors_of_each_child() {
    destroy_trim_crash_and_read_back(TopVdevKind::Raidz1, 4, 12);
    destroy_trim_crash_and_read_back(TopVdevKind::Raidz2, 5, 13);
}

#[test]
fn a_device_without_discard_is_reported_once_and_stays_healthy() {
    let disks = devices(2, DEVICE_BYTES, 21);
    disks[1].set_discard(false);
    Runtime::new_sim(21).block_on(async {
        let pool = manual_mirror(&disks).await;
        let on = BTreeMap::from([("autotrim".to_string(), "on".to_string())]);
        pool.set_properties("tank", &on).await.unwrap();
        let mut refused_after_first_round = 0;
        for round in 0..3u64 {
            pool.create_volume("tank/v", VOLUME_BYTES, BLOCK as u32, BTreeMap::new())
                .await
                .unwrap();
            fill(&pool, "tank/v", round << 20).await;
            pool.flush_all().await.unwrap();
            pool.destroy_volume("tank/v", false).await.unwrap();
            for _ in 0..4 {
                pool.commit().await.unwrap();
            }
            wait_for_autotrim(&pool).await;
            if round == 0 {
                refused_after_first_round = disks[1].counters().refused_trims;
                assert!(refused_after_first_round > 0, "no discard reached sim:d1");
            }
        }
        pool.trim_start().unwrap();
        pool.trim_wait().await;
        let status = pool.trim_status();
        assert_eq!(status.unsupported_devices, vec!["sim:d1".to_string()]);
        assert_eq!(status.state, "finished", "{status:?}");
        assert!(
            disks[0].counters().trims > 0,
            "the other side was not trimmed"
        );
        // Only the discards already in flight when it first answered reach
        // it; never one after.
        assert_eq!(
            disks[1].counters().refused_trims,
            refused_after_first_round,
            "the device without discard was asked again"
        );
        assert_eq!(pool.health(), "ONLINE");
        for top in pool.store().vdevs().iter() {
            for leaf in &top.children {
                let stats = leaf.queue.stats();
                assert_eq!(
                    (
                        stats.write_errors,
                        stats.trim_errors,
                        stats.consecutive_errors
                    ),
                    (0, 0, 0),
                    "{}",
                    leaf.path.borrow()
                );
            }
        }
        pool.export().await.unwrap();
    });
}

/// A TRIM of a whole volume (as mkfs or blkdiscard send) is linked a slice
/// of blocks at a time, with the engine's other requests served between:
/// reads of another volume are answered while it goes on (holes link
/// without waiting on a device, so it used to run to its end in one
/// turn), and the range reads as zeros after it.
#[test]
fn a_volume_wide_trim_lets_other_volumes_be_served_meanwhile() {
    let disks = devices(2, DEVICE_BYTES, 23);
    Runtime::new_sim(23).block_on(async {
        let pool = manual_mirror(&disks).await;
        for name in ["tank/big", "tank/other"] {
            pool.create_volume(name, VOLUME_BYTES, BLOCK as u32, BTreeMap::new())
                .await
                .unwrap();
        }
        fill(&pool, "tank/big", 1).await;
        fill(&pool, "tank/other", 2 << 20).await;
        pool.commit().await.unwrap();
        let big = pool.volume("tank/big").unwrap();
        let other = pool.volume("tank/other").unwrap();
        // Its block is read into the cache first: the reads below wait on
        // no device (simulated time stands still while a task is ready).
        pool.read(&other, 0, BLOCK).await.unwrap();
        let trimmed = std::cell::Cell::new(false);
        let reads_meanwhile = std::cell::Cell::new(0);
        let trim = async {
            pool.zero(&big, 0, VOLUME_BYTES, false, true).await.unwrap();
            trimmed.set(true);
        };
        let reads = async {
            while !trimmed.get() {
                let bytes = ReadPiece::concat(pool.read(&other, 0, BLOCK).await.unwrap());
                assert!(bytes == *random_pattern(BLOCK as usize, 2 << 20));
                if !trimmed.get() {
                    reads_meanwhile.set(reads_meanwhile.get() + 1);
                }
                ironpool::rt::yield_now().await;
            }
        };
        futures_util::future::join(trim, reads).await;
        assert!(
            reads_meanwhile.get() >= 4,
            "{} reads answered during a trim of {} blocks",
            reads_meanwhile.get(),
            VOLUME_BYTES / BLOCK
        );
        for blkid in 0..VOLUME_BYTES / BLOCK {
            let bytes = ReadPiece::concat(pool.read(&big, blkid * BLOCK, BLOCK).await.unwrap());
            assert!(
                bytes.iter().all(|byte| *byte == 0),
                "block {blkid} after the trim"
            );
        }
        assert_filled(&pool, "tank/other", 2 << 20).await;
        pool.export().await.unwrap();
    });
}
