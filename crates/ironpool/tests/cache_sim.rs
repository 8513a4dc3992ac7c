//! The read cache in the simulator: reads it serves touch no device, damage
//! under a cached block is invisible until the block is evicted and then
//! healed as before, it keeps within its bound, the dataset properties that
//! bypass it do, sequential readers are read ahead, and snapshots, rollback
//! and clones never see another block's bytes.
//!
//! (The random model test with a cache that evicts all the time is the
//! simulator's: `ironpool-sim` draws `arc_max_bytes` down to 256 KiB.)

mod sim_support;

use std::collections::BTreeMap;
use std::rc::Rc;

use ironpool::dev::sim::SimDevice;
use ironpool::format::label::TopVdevKind;
use ironpool::pool::volume::{ReadPiece, Volume};
use ironpool::pool::Pool;
use ironpool::rt::sim::Rng;
use ironpool::rt::Runtime;
use sim_support::{corrupt_block, devices, layout, manual_commits, random_pattern};

const DEVICE_BYTES: u64 = 256 << 20;
const VOLUME_BYTES: u64 = 32 << 20;
const BLOCK: u64 = 16 << 10;

async fn mirror_with_volume(disks: &[Rc<SimDevice>], arc_max_bytes: u64) -> (Rc<Pool>, Rc<Volume>) {
    let tunables = ironpool::pool::PoolTunables {
        arc_max_bytes,
        ..manual_commits()
    };
    let pool = Pool::create_on_devices("tank", layout(disks, TopVdevKind::Mirror), false, tunables)
        .await
        .unwrap();
    let volume = pool
        .create_volume("tank/v", VOLUME_BYTES, BLOCK as u32, BTreeMap::new())
        .await
        .unwrap();
    (pool, volume)
}

async fn read(pool: &Rc<Pool>, volume: &Rc<Volume>, offset: u64, length: u64) -> Vec<u8> {
    ReadPiece::concat(pool.read(volume, offset, length).await.unwrap())
}

fn device_reads(disks: &[Rc<SimDevice>]) -> u64 {
    disks.iter().map(|disk| disk.counters().reads).sum()
}

#[test]
fn a_cached_block_is_served_over_damage_and_healed_once_evicted() {
    let disks = devices(2, DEVICE_BYTES, 61);
    let mut rng = Rng::new(61);
    Runtime::new_sim(61).block_on(async {
        let (pool, volume) = mirror_with_volume(&disks, 64 << 20).await;
        let data = random_pattern(1 << 20, 61);
        pool.write(&volume, 0, data.clone(), false).await.unwrap();
        pool.commit().await.unwrap();
        assert_eq!(read(&pool, &volume, 0, 1 << 20).await, &data[..]);
        // Block 3 rots on d0, block 5 on d1: each keeps one good copy.
        for (blkid, disk) in [(3u64, 0usize), (5, 1)] {
            corrupt_block(&pool, &volume, blkid, &disks[disk], &mut rng).await;
        }
        // Cached: served from memory, no device read, no error seen.
        let before = device_reads(&disks);
        assert_eq!(read(&pool, &volume, 0, 1 << 20).await, &data[..]);
        assert_eq!(
            device_reads(&disks),
            before,
            "a cached read went to a device"
        );
        assert_eq!(pool.store().stats().healed_reads, 0);
        // Evicted (the cache shrunk to nothing): read from the devices, the
        // bad copies found and rewritten from the good ones, as without a
        // cache.
        pool.set_tunable("arc_max_bytes", "0").unwrap();
        assert_eq!(pool.store().cache.stats().size_bytes, 0);
        // (Each read takes a side at random: read until both bad copies
        // were met and healed.)
        for _ in 0..64 {
            assert_eq!(read(&pool, &volume, 0, 1 << 20).await, &data[..]);
            pool.store().repairs_quiesced().await;
            if pool.store().stats().healed_reads >= 2 {
                break;
            }
        }
        let healed = pool.store().stats();
        assert!(
            healed.healed_reads >= 2 && healed.repair_writes >= 2,
            "{healed:?}"
        );
        // Repaired on the media: reading each side alone finds no damage.
        let errors = |pool: &Rc<Pool>| -> u64 {
            pool.store().vdevs()[0]
                .children
                .iter()
                .map(|leaf| leaf.queue.stats().checksum_errors)
                .sum()
        };
        let counted = errors(&pool);
        for _ in 0..8 {
            assert_eq!(read(&pool, &volume, 0, 1 << 20).await, &data[..]);
        }
        assert_eq!(errors(&pool), counted, "damage left after self-heal");
        pool.export().await.unwrap();
    });
}

#[test]
fn a_warm_working_set_is_read_from_memory_and_the_cache_keeps_its_bound() {
    let disks = devices(2, DEVICE_BYTES, 62);
    Runtime::new_sim(62).block_on(async {
        let bound = 4u64 << 20;
        let (pool, volume) = mirror_with_volume(&disks, bound).await;
        let data = random_pattern(VOLUME_BYTES as usize, 62);
        pool.write(&volume, 0, data.clone(), false).await.unwrap();
        pool.commit().await.unwrap();
        // Random 4K reads over the whole volume (8x the cache): evicting
        // all the time, always right, never above the bound.
        let mut rng = Rng::new(62);
        for _ in 0..2000 {
            let offset = rng.below(VOLUME_BYTES / 4096) * 4096;
            let got = read(&pool, &volume, offset, 4096).await;
            assert_eq!(got, &data[offset as usize..offset as usize + 4096]);
            let stats = pool.store().cache.stats();
            assert!(
                stats.size_bytes <= bound,
                "{} above {bound}",
                stats.size_bytes
            );
        }
        // A 1 MiB working set, read twice (warm) then again: no device I/O,
        // every demand read a hit. (Its blocks in a scattered order: in
        // order, they would be a sequential stream, read ahead past the set.)
        let hot = 8u64 << 20;
        for pass in 0..3 {
            let before = device_reads(&disks);
            let hits = pool.store().cache.stats().demand_data.hits;
            for index in 0..64u64 {
                let block = index * 37 % 64;
                let offset = hot + block * BLOCK + 4096;
                let got = read(&pool, &volume, offset, 4096).await;
                assert_eq!(got, &data[offset as usize..offset as usize + 4096]);
            }
            if pass == 2 {
                assert_eq!(
                    device_reads(&disks),
                    before,
                    "warm reads went to the devices"
                );
                assert_eq!(pool.store().cache.stats().demand_data.hits - hits, 64);
            }
            ironpool::rt::sleep(std::time::Duration::from_millis(100)).await;
        }
        pool.export().await.unwrap();
    });
}

#[test]
fn direct_always_and_primarycache_keep_the_data_out_of_the_cache() {
    let disks = devices(2, DEVICE_BYTES, 63);
    Runtime::new_sim(63).block_on(async {
        let (pool, volume) = mirror_with_volume(&disks, 64 << 20).await;
        let data = random_pattern(1 << 20, 63);
        pool.write(&volume, 0, data.clone(), false).await.unwrap();
        pool.commit().await.unwrap();
        let set = |name: &str, value: &str| BTreeMap::from([(name.to_string(), value.to_string())]);
        for (property, value) in [
            ("direct", "always"),
            ("primarycache", "metadata"),
            ("primarycache", "none"),
        ] {
            pool.set_tunable("arc_drop", "1").unwrap();
            pool.set_properties("tank/v", &set(property, value))
                .await
                .unwrap();
            for _ in 0..2 {
                let (before, hits) = (device_reads(&disks), volume.stats().cache_hit_blocks);
                assert_eq!(read(&pool, &volume, 0, 1 << 20).await, &data[..]);
                assert!(
                    device_reads(&disks) > before,
                    "{property}={value}: no device read"
                );
                assert_eq!(
                    volume.stats().cache_hit_blocks,
                    hits,
                    "{property}={value}: data read from memory"
                );
            }
            let stats = pool.store().cache.stats();
            assert_eq!(
                stats.data_bytes, 0,
                "{property}={value} kept data: {stats:?}"
            );
            pool.inherit_property("tank/v", property).await.unwrap();
        }
        // Back to the defaults: the second read is the cache's.
        pool.set_tunable("arc_drop", "1").unwrap();
        read(&pool, &volume, 0, 1 << 20).await;
        let before = device_reads(&disks);
        assert_eq!(read(&pool, &volume, 0, 1 << 20).await, &data[..]);
        assert_eq!(device_reads(&disks), before);
        pool.export().await.unwrap();
    });
}

#[test]
fn a_sequential_reader_finds_its_next_blocks_read_ahead() {
    let disks = devices(2, DEVICE_BYTES, 64);
    Runtime::new_sim(64).block_on(async {
        let (pool, volume) = mirror_with_volume(&disks, 64 << 20).await;
        let data = random_pattern(VOLUME_BYTES as usize, 64);
        pool.write(&volume, 0, data.clone(), false).await.unwrap();
        pool.commit().await.unwrap();
        pool.set_tunable("arc_drop", "1").unwrap();
        // 128K sequential reads, one at a time, as `dd` would.
        let request = 128u64 << 10;
        for index in 0..(16 << 20) / request {
            let offset = index * request;
            let got = read(&pool, &volume, offset, request).await;
            assert_eq!(got, &data[offset as usize..(offset + request) as usize]);
        }
        let (prefetched, _) = pool.prefetch_counters();
        let stats = pool.store().cache.stats();
        let demand = stats.demand_data;
        assert!(prefetched > 0, "nothing was read ahead");
        // All but the first requests' blocks found read ahead (cached, or
        // in flight and shared).
        let served_ahead = demand.hits + stats.shared_reads;
        assert!(
            served_ahead * 10 >= (demand.hits + demand.misses) * 8,
            "{served_ahead} of {} demand reads were read ahead: {stats:?}",
            demand.hits + demand.misses
        );
        // Drop-behind: what the reader finished left the cache; 16 MiB read,
        // a few MiB (the read-ahead window) held.
        assert!(stats.dropped_behind > 500, "{stats:?}");
        assert!(stats.data_bytes < 12 << 20, "{stats:?}");
        // A 4K sequential reader: a block read ahead is dropped only by the
        // read that finishes it, so no block is read twice.
        let misses = volume.stats().cache_miss_blocks;
        let first = 20u64 << 20;
        for index in 0..(4 << 20) / 4096 {
            let offset = first + index * 4096;
            let got = read(&pool, &volume, offset, 4096).await;
            assert_eq!(got, &data[offset as usize..offset as usize + 4096]);
        }
        let blocks = (4 << 20) / BLOCK;
        let missed = volume.stats().cache_miss_blocks - misses;
        assert!(missed <= blocks, "{missed} misses for {blocks} blocks");
        pool.export().await.unwrap();
    });
}

#[test]
fn snapshots_rollback_and_clones_read_their_own_blocks_through_the_cache() {
    let disks = devices(2, DEVICE_BYTES, 65);
    Runtime::new_sim(65).block_on(async {
        let (pool, volume) = mirror_with_volume(&disks, 64 << 20).await;
        let first = random_pattern(1 << 20, 651);
        let second = random_pattern(1 << 20, 652);
        pool.write(&volume, 0, first.clone(), false).await.unwrap();
        pool.snapshot(&["tank/v@one".to_string()]).await.unwrap();
        assert_eq!(read(&pool, &volume, 0, 1 << 20).await, &first[..]);
        pool.write(&volume, 0, second.clone(), false).await.unwrap();
        pool.commit().await.unwrap();
        assert_eq!(read(&pool, &volume, 0, 1 << 20).await, &second[..]);
        let snapshot = pool.snapshot_volume("tank/v@one").await.unwrap();
        assert_eq!(read(&pool, &snapshot, 0, 1 << 20).await, &first[..]);
        let clone = pool.clone_snapshot("tank/v@one", "tank/c").await.unwrap();
        assert_eq!(read(&pool, &clone, 0, 1 << 20).await, &first[..]);
        pool.rollback("tank/v@one", false).await.unwrap();
        let volume = pool.volume("tank/v").unwrap();
        assert_eq!(read(&pool, &volume, 0, 1 << 20).await, &first[..]);
        // Freed blocks left the cache; their space written again reads new.
        let third = random_pattern(1 << 20, 653);
        pool.write(&clone, 0, third.clone(), false).await.unwrap();
        for _ in 0..4 {
            pool.commit().await.unwrap();
        }
        assert_eq!(read(&pool, &clone, 0, 1 << 20).await, &third[..]);
        assert_eq!(read(&pool, &volume, 0, 1 << 20).await, &first[..]);
        assert!(pool.store().cache.stats().freed > 0);
        pool.export().await.unwrap();
    });
}
