//! Write-back on simulated devices, deterministic from seeds: acknowledged
//! writes are held in memory and read back from there, a flush writes them out
//! and makes them survive a crash, a write-back that fails fails the next
//! flush and keeps the data, and dirty data stays under its limit.

mod sim_support;

use std::collections::BTreeMap;
use std::rc::Rc;

use ironpool::dev::sim::{SimDevice, SimFaults};
use ironpool::format::label::TopVdevKind;
use ironpool::pool::volume::ReadPiece;
use ironpool::pool::{Pool, PoolTunables};
use ironpool::rt::sim::Rng;
use ironpool::rt::Runtime;
use sim_support::{crash_all, devices, layout, manual_commits, named, random_pattern};

const DEVICE_BYTES: u64 = 128 << 20;
const VOLUME_BYTES: u64 = 32 << 20;
const BLOCK: u64 = 16384;

async fn new_pool(disks: &[Rc<SimDevice>], kind: TopVdevKind, tunables: PoolTunables) -> Rc<Pool> {
    let pool = Pool::create_on_devices("tank", layout(disks, kind), false, tunables)
        .await
        .unwrap();
    pool.create_volume("tank/vol", VOLUME_BYTES, BLOCK as u32, BTreeMap::new())
        .await
        .unwrap();
    pool
}

async fn read(pool: &Rc<Pool>, offset: u64, length: u64) -> Vec<u8> {
    let volume = pool.volume("tank/vol").unwrap();
    ReadPiece::concat(pool.read(&volume, offset, length).await.unwrap())
}

fn device_writes(disks: &[Rc<SimDevice>]) -> u64 {
    disks.iter().map(|disk| disk.counters().writes).sum()
}

#[test]
fn writes_are_held_read_back_from_memory_and_a_flush_makes_them_survive_a_crash() {
    let disks = devices(2, DEVICE_BYTES, 1);
    let mut rng = Rng::new(1);
    // Blocks 0, 2, 4, ... and a partial write into block 1 (read-modify-write
    // of a block that is itself dirty: merged in memory).
    let blocks: Vec<u64> = (0..64).map(|index| index * 2).collect();
    Runtime::new_sim(1).block_on(async {
        let pool = new_pool(&disks, TopVdevKind::Mirror, manual_commits()).await;
        let volume = pool.volume("tank/vol").unwrap();
        let before = device_writes(&disks);
        for &blkid in &blocks {
            pool.write(
                &volume,
                blkid * BLOCK,
                random_pattern(BLOCK as usize, blkid),
                false,
            )
            .await
            .unwrap();
        }
        pool.write(&volume, BLOCK, random_pattern(BLOCK as usize, 1000), false)
            .await
            .unwrap();
        pool.write(&volume, BLOCK + 4096, random_pattern(4096, 1001), false)
            .await
            .unwrap();
        let stats = volume.stats();
        assert_eq!(stats.dirty_bytes, 65 * BLOCK, "every block held: {stats:?}");
        assert_eq!(
            device_writes(&disks),
            before,
            "nothing written to the devices yet"
        );
        for &blkid in &blocks {
            assert!(
                read(&pool, blkid * BLOCK, BLOCK).await == *random_pattern(BLOCK as usize, blkid),
                "block {blkid} read back"
            );
        }
        let mut expected = random_pattern(BLOCK as usize, 1000).to_vec();
        expected[4096..8192].copy_from_slice(&random_pattern(4096, 1001));
        assert!(
            read(&pool, BLOCK, BLOCK).await == expected,
            "the partial write merged into the dirty block"
        );
        assert!(volume.stats().dirty_read_blocks >= 65);
        pool.flush_all().await.unwrap();
        let stats = volume.stats();
        assert_eq!(stats.dirty_bytes, 0, "{stats:?}");
        assert_eq!(stats.writeback_blocks, 65, "{stats:?}");
        assert!(device_writes(&disks) > before);
        // The power goes: whatever the devices had not flushed is lost.
        crash_all(&disks, &mut rng);
    });
    Runtime::new_sim(2).block_on(async {
        let pool = Pool::import_from_devices("tank", named(&disks), manual_commits())
            .await
            .unwrap();
        for &blkid in &blocks {
            assert!(
                read(&pool, blkid * BLOCK, BLOCK).await == *random_pattern(BLOCK as usize, blkid),
                "block {blkid} after the crash"
            );
        }
        let mut expected = random_pattern(BLOCK as usize, 1000).to_vec();
        expected[4096..8192].copy_from_slice(&random_pattern(4096, 1001));
        assert!(
            read(&pool, BLOCK, BLOCK).await == expected,
            "block 1 after the crash"
        );
        let report = pool.check_space().await.unwrap();
        assert!(report.problems.is_empty(), "{:?}", report.problems);
        pool.export().await.unwrap();
    });
}

#[test]
fn a_failed_write_back_fails_the_next_flush_and_keeps_the_data() {
    let disks = devices(1, DEVICE_BYTES, 2);
    Runtime::new_sim(3).block_on(async {
        let pool = new_pool(&disks, TopVdevKind::Disk, manual_commits()).await;
        let volume = pool.volume("tank/vol").unwrap();
        for blkid in 0..4u64 {
            pool.write(
                &volume,
                blkid * BLOCK,
                random_pattern(BLOCK as usize, blkid),
                false,
            )
            .await
            .unwrap();
        }
        // The device refuses every write: the held blocks cannot be written.
        disks[0].set_faults(SimFaults {
            write_error_ppm: 1_000_000,
            ..SimFaults::default()
        });
        let error = pool
            .flush_all()
            .await
            .expect_err("the flush must report the lost write-back");
        assert!(
            error
                .to_string()
                .contains("writing out acknowledged data failed"),
            "{error}"
        );
        assert!(volume.stats().writeback_errors >= 1);
        // Still readable, from memory.
        for blkid in 0..4u64 {
            assert!(
                read(&pool, blkid * BLOCK, BLOCK).await == *random_pattern(BLOCK as usize, blkid),
                "block {blkid} kept"
            );
        }
        // While write-back fails, writes go through and meet the error themselves.
        assert!(pool
            .write(
                &volume,
                10 * BLOCK,
                random_pattern(BLOCK as usize, 10),
                false
            )
            .await
            .is_err());
        // The device recovers: the next flush writes the held blocks out.
        disks[0].set_faults(SimFaults::default());
        pool.flush_all().await.unwrap();
        assert_eq!(volume.stats().dirty_bytes, 0);
        pool.export().await.unwrap();
    });
    Runtime::new_sim(4).block_on(async {
        let pool = Pool::import_from_devices("tank", named(&disks), manual_commits())
            .await
            .unwrap();
        for blkid in 0..4u64 {
            assert!(
                read(&pool, blkid * BLOCK, BLOCK).await == *random_pattern(BLOCK as usize, blkid),
                "block {blkid} after import"
            );
        }
        pool.export().await.unwrap();
    });
}

#[test]
fn dirty_data_stays_under_its_limit_and_zero_turns_write_back_off() {
    dirty_data_stays_under_its_limit(TopVdevKind::Mirror, 2);
}

/// On RAID-Z the limit covers the parity computed for held blocks too (8 KiB
/// per 16 KiB block on raidz2 of 6).
#[test]
fn dirty_data_with_its_parity_stays_under_its_limit_on_raidz() {
    dirty_data_stays_under_its_limit(TopVdevKind::raidz(2).unwrap(), 6);
}

fn dirty_data_stays_under_its_limit(kind: TopVdevKind, children: usize) {
    let disks = devices(children, DEVICE_BYTES, 3);
    Runtime::new_sim(5).block_on(async {
        let limit = 256 << 10;
        let pool = new_pool(
            &disks,
            kind,
            PoolTunables {
                dirty_data_max_bytes: limit,
                ..manual_commits()
            },
        )
        .await;
        let volume = pool.volume("tank/vol").unwrap();
        // 32 writers at once, 32 blocks each: 16 MiB through a 256 KiB limit.
        let peak = Rc::new(std::cell::Cell::new(0u64));
        let writers = (0..32u64).map(|writer| {
            let pool = pool.clone();
            let volume = volume.clone();
            let peak = peak.clone();
            async move {
                for index in 0..32u64 {
                    let blkid = writer * 32 + index;
                    pool.write(
                        &volume,
                        blkid * BLOCK,
                        random_pattern(BLOCK as usize, blkid),
                        false,
                    )
                    .await
                    .unwrap();
                    peak.set(peak.get().max(pool.dirty_data_bytes()));
                }
            }
        });
        futures_util::future::join_all(writers).await;
        assert!(peak.get() > 0, "write-back was used");
        assert!(
            peak.get() <= limit,
            "dirty data peaked at {} over the {limit} limit",
            peak.get()
        );
        pool.flush_all().await.unwrap();
        for blkid in (0..1024u64).step_by(37) {
            assert!(
                read(&pool, blkid * BLOCK, BLOCK).await == *random_pattern(BLOCK as usize, blkid),
                "block {blkid}"
            );
        }
        // Off: every write is written through before it returns.
        pool.set_tunable("dirty_data_max_bytes", "0").unwrap();
        let before = volume.stats().writeback_blocks;
        for blkid in 0..16u64 {
            pool.write(
                &volume,
                blkid * BLOCK,
                random_pattern(BLOCK as usize, blkid + 5000),
                false,
            )
            .await
            .unwrap();
            assert_eq!(pool.dirty_data_bytes(), 0);
        }
        assert_eq!(volume.stats().writeback_blocks, before);
        pool.export().await.unwrap();
    });
}
