//! The engine on simulated devices: deterministic from a seed.

mod sim_support;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use ironpool::dev::sim::{SimDevice, SimLatency};
use ironpool::format::label::TopVdevKind;
use ironpool::pool::volume::ReadPiece;
use ironpool::pool::{Pool, PoolTunables};
use ironpool::rt::buf::{AlignedBuf, BufSlice};
use ironpool::rt::sim::Rng;
use ironpool::rt::{self, Runtime};
use sim_support::{crash_all, devices, layout, named};

const DEVICE_BYTES: u64 = 256 << 20;

fn tunables() -> PoolTunables {
    PoolTunables {
        txg_timeout: Duration::from_millis(50),
        ..PoolTunables::default()
    }
}

/// A pool named "tank" of one mirror of `disks`, with [`tunables`].
async fn mirror_pool(disks: &[Rc<SimDevice>]) -> Rc<Pool> {
    sim_support::mirror_with(disks, tunables()).await
}

fn pattern(length: usize, tag: u64) -> BufSlice {
    let mut buffer = AlignedBuf::zeroed(length);
    for (index, chunk) in buffer.chunks_mut(8).enumerate() {
        let value = tag
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .wrapping_add(index as u64);
        chunk.copy_from_slice(&value.to_le_bytes()[..chunk.len()]);
    }
    BufSlice::whole(buffer.into_shared())
}

#[test]
fn write_read_export_import_round_trip() {
    let disks = devices(2, DEVICE_BYTES, 1);
    {
        let runtime = Runtime::new_sim(1);
        runtime.block_on(async {
            let pool = mirror_pool(&disks).await;
            let volume = pool
                .create_volume("tank/vol", 64 << 20, 16384, BTreeMap::new())
                .await
                .unwrap();
            // Unwritten space reads as zeros.
            assert!(
                ReadPiece::concat(pool.read(&volume, 0, 65536).await.unwrap())
                    .iter()
                    .all(|byte| *byte == 0)
            );
            for index in 0..64u64 {
                pool.write(&volume, index * 65536 + 4096, pattern(20480, index), false)
                    .await
                    .unwrap();
            }
            for index in 0..64u64 {
                let data = ReadPiece::concat(
                    pool.read(&volume, index * 65536 + 4096, 20480)
                        .await
                        .unwrap(),
                );
                assert_eq!(&data[..], &pattern(20480, index)[..], "block {index}");
            }
            let report = pool.check_space().await.unwrap();
            assert!(report.problems.is_empty(), "{:?}", report.problems);
            pool.export().await.unwrap();
        });
    }
    let runtime = Runtime::new_sim(2);
    runtime.block_on(async {
        let pool = Pool::import_from_devices("tank", named(&disks), tunables())
            .await
            .unwrap();
        let volume = pool.volume("tank/vol").unwrap();
        for index in 0..64u64 {
            let data = ReadPiece::concat(
                pool.read(&volume, index * 65536 + 4096, 20480)
                    .await
                    .unwrap(),
            );
            assert_eq!(
                &data[..],
                &pattern(20480, index)[..],
                "block {index} after import"
            );
        }
        let report = pool.check_space().await.unwrap();
        assert!(report.problems.is_empty(), "{:?}", report.problems);
        pool.export().await.unwrap();
    });
}

/// Per 512-byte sector: the writes that touched it, in order, with whether each
/// was acknowledged before the last completed flush began.
#[derive(Default)]
struct Model {
    /// sector -> list of (write id, acknowledged?)
    sectors: BTreeMap<u64, Vec<(u64, bool)>>,
    /// sector -> index in its list of the newest write that must be durable.
    durable: BTreeMap<u64, usize>,
    /// Writes acknowledged so far (id -> sectors).
    acked: Vec<u64>,
}

fn sector_pattern(write_id: u64, sector: u64) -> [u8; 512] {
    let mut bytes = [0u8; 512];
    bytes[..8].copy_from_slice(&write_id.to_le_bytes());
    bytes[8..16].copy_from_slice(&sector.to_le_bytes());
    for (index, byte) in bytes.iter_mut().enumerate().skip(16) {
        *byte = (write_id as u8)
            .wrapping_mul(7)
            .wrapping_add(index as u8)
            .wrapping_add(sector as u8);
    }
    bytes
}

/// Random writes and flushes from several tasks; crash at a random instant; import
/// and check that every flushed write is there and nothing else is invented.
/// One seed in three has a single client that flushes after nearly every
/// write and is answered as the NBD engine answers it, with the commit that
/// FLUSH is expected to ask for started as each write is answered
/// (`Pool::log_ahead`), so crashes land in those commits and in the FLUSHes
/// waiting on them (half of those seeds with two commits in flight at most,
/// so that a FLUSH finds its write in one still in flight). Returns how
/// many such commits wrote their blocks before the crash.
fn crash_run(seed: u64, kind: TopVdevKind, width: usize) -> u64 {
    let lone = seed.is_multiple_of(3);
    let mut rng = Rng::new(seed);
    let disks = devices(width, DEVICE_BYTES, seed);
    let volume_bytes: u64 = 32 << 20;
    let model = Rc::new(RefCell::new(Model::default()));
    let ahead_commits;
    {
        let runtime = Runtime::new_sim(seed);
        // The lone client waits for each FLUSH: it runs longer for as many
        // commits as the others make.
        let crash_after = match lone {
            true => Duration::from_millis(100 + rng.below(1900)),
            false => Duration::from_millis(50 + rng.below(400)),
        };
        let worker_seed = rng.next_u64();
        let pool_holder: Rc<RefCell<Option<Rc<Pool>>>> = Rc::new(RefCell::new(None));
        let holder = pool_holder.clone();
        let model_for_run = model.clone();
        let run_disks = disks.clone();
        runtime.block_on(async move {
            let disks = run_disks;
            // Half the lone client's seeds let two commits be in flight, so
            // that its FLUSH finds its write logged by the commit started
            // ahead, still in flight, and must wait for that one to end.
            let mut run_tunables = tunables();
            if lone && seed.is_multiple_of(2) {
                run_tunables.log_commits_in_flight = 2;
            }
            let pool = Pool::create_on_devices("tank", layout(&disks, kind), false, run_tunables)
                .await
                .unwrap();
            pool.create_volume("tank/vol", volume_bytes, 16384, BTreeMap::new())
                .await
                .unwrap();
            *holder.borrow_mut() = Some(pool.clone());
            // Regions of 64 KiB are owned by one worker at a time: no overlapping
            // writes in flight (as a well-behaved client).
            let busy = Rc::new(RefCell::new(std::collections::BTreeSet::new()));
            let next_id = Rc::new(std::cell::Cell::new(1u64));
            for worker in 0..if lone { 1 } else { 8u64 } {
                let pool = pool.clone();
                let model = model_for_run.clone();
                let busy = busy.clone();
                let next_id = next_id.clone();
                rt::spawn(async move {
                    let mut rng = Rng::new(worker_seed ^ worker);
                    let volume = pool.volume("tank/vol").unwrap();
                    let mut flush_next = false;
                    loop {
                        let flush = match lone {
                            true => std::mem::take(&mut flush_next),
                            false => rng.chance(1, 12),
                        };
                        if flush {
                            // Flush: everything acknowledged before it must survive.
                            let acked_snapshot: Vec<(u64, usize)> = {
                                let model = model.borrow();
                                model
                                    .sectors
                                    .iter()
                                    .filter_map(|(sector, writes)| {
                                        writes
                                            .iter()
                                            .rposition(|(_, acked)| *acked)
                                            .map(|index| (*sector, index))
                                    })
                                    .collect()
                            };
                            // A client's FLUSH goes through the volume's
                            // intent log; the pool-wide one through a txg.
                            let flushed = if rng.chance(1, 2) {
                                pool.flush_volume(&volume).await
                            } else {
                                pool.flush_all().await
                            };
                            if flushed.is_ok() {
                                let mut model = model.borrow_mut();
                                for (sector, index) in acked_snapshot {
                                    let entry = model.durable.entry(sector).or_insert(0);
                                    *entry = (*entry).max(index);
                                }
                            }
                            continue;
                        }
                        let region = rng.below(volume_bytes / 65536);
                        if !busy.borrow_mut().insert(region) {
                            rt::yield_now().await;
                            continue;
                        }
                        let sectors_in_region = 128u64;
                        let first = rng.below(sectors_in_region);
                        let count = 1 + rng.below((sectors_in_region - first).min(80));
                        let offset = region * 65536 + first * 512;
                        let id = next_id.get();
                        next_id.set(id + 1);
                        let mut buffer = AlignedBuf::zeroed(count as usize * 512);
                        for sector in 0..count {
                            let absolute = offset / 512 + sector;
                            buffer[sector as usize * 512..(sector as usize + 1) * 512]
                                .copy_from_slice(&sector_pattern(id, absolute));
                        }
                        {
                            let mut model = model.borrow_mut();
                            for sector in 0..count {
                                model
                                    .sectors
                                    .entry(offset / 512 + sector)
                                    .or_default()
                                    .push((id, false));
                            }
                        }
                        let fua = rng.chance(1, 20);
                        let result = pool
                            .write(&volume, offset, BufSlice::whole(buffer.into_shared()), fua)
                            .await;
                        {
                            let mut model = model.borrow_mut();
                            if result.is_ok() {
                                model.acked.push(id);
                            }
                            for sector in 0..count {
                                let writes =
                                    model.sectors.get_mut(&(offset / 512 + sector)).unwrap();
                                let index =
                                    writes.iter().position(|(write, _)| *write == id).unwrap();
                                writes[index].1 = result.is_ok();
                                if fua && result.is_ok() {
                                    let entry =
                                        model.durable.entry(offset / 512 + sector).or_insert(0);
                                    *entry = (*entry).max(index);
                                }
                            }
                        }
                        busy.borrow_mut().remove(&region);
                        if lone {
                            // As the NBD engine does after the answer: the
                            // commit runs on while the client goes on, and
                            // its FLUSH (or next write) meets it in flight.
                            let (pool, volume) = (pool.clone(), volume.clone());
                            rt::spawn(async move { pool.log_ahead(&volume).await });
                            rt::yield_now().await;
                            flush_next = rng.chance(9, 10);
                        }
                    }
                });
            }
            rt::sleep(crash_after).await;
        });
        ahead_commits = pool_holder
            .borrow()
            .as_ref()
            .and_then(|pool| pool.volume("tank/vol").ok())
            .map_or(0, |volume| volume.log_stats().ahead_commits);
        // Power fails: tasks vanish, unflushed writes are partly lost.
        runtime.drop_all_tasks();
        pool_holder.borrow_mut().take();
        crash_all(&disks, &mut Rng::new(seed ^ 0xc0ffee));
    }
    let runtime = Runtime::new_sim(seed + 1);
    let disks = disks.clone();
    if std::env::var_os("IRONPOOL_SIM_VERBOSE").is_some() {
        let probe_disks = disks.clone();
        runtime.block_on(async move {
            for disk in &probe_disks {
                let probe =
                    ironpool::pool::labels::probe_device(&**disk, std::path::Path::new("sim"))
                        .await;
                let mut txgs: Vec<u64> = probe
                    .uberblocks
                    .iter()
                    .map(|uberblock| uberblock.txg)
                    .collect();
                txgs.sort_unstable();
                txgs.dedup();
                eprintln!(
                    "seed {seed}: device uberblocks {:?}",
                    &txgs[txgs.len().saturating_sub(6)..]
                );
            }
        });
    }
    runtime.block_on(async move {
        let pool = Pool::import_from_devices("tank", named(&disks), tunables()).await.unwrap_or_else(|error| panic!("seed {seed}: import failed: {error}"));
        let volume = pool.volume("tank/vol").unwrap();
        // The writers are gone: take the model so no borrow spans the reads.
        let model = std::mem::take(&mut *model.borrow_mut());
        let mut checked = 0;
        for (sector, writes) in &model.sectors {
            let data = ReadPiece::concat(pool.read(&volume, sector * 512, 512).await.unwrap());
            let found_id = u64::from_le_bytes(data[..8].try_into().unwrap());
            let minimum_index = model.durable.get(sector).copied();
            let allowed: Vec<u64> = match minimum_index {
                Some(index) => writes[index..].iter().map(|(id, _)| *id).collect(),
                None => std::iter::once(0).chain(writes.iter().map(|(id, _)| *id)).collect(),
            };
            if found_id == 0 {
                assert!(data.iter().all(|byte| *byte == 0), "seed {seed}: sector {sector} is neither zeros nor a write");
            } else {
                assert_eq!(&data[..], &sector_pattern(found_id, *sector)[..], "seed {seed}: sector {sector} holds damaged data");
            }
            assert!(allowed.contains(&found_id), "seed {seed}: sector {sector} holds write {found_id}, allowed {allowed:?} (durable index {minimum_index:?})");
            checked += 1;
        }
        let report = pool.check_space().await.unwrap();
        assert!(report.problems.is_empty(), "seed {seed}: {:?}", report.problems);
        pool.scrub_start().unwrap();
        pool.scrub_wait().await;
        let scrub = pool.scrub_status();
        assert_eq!(scrub.errors, 0, "seed {seed}: scrub errors {:?}", scrub.error_details);
        assert_eq!(scrub.bad_copies, 0, "seed {seed}: scrub found bad copies: {:?} (imported txg {})", scrub.error_details, pool.imported_txg());
        if std::env::var("IRONPOOL_SIM_VERBOSE").is_ok() {
            let durable = model.durable.len();
            eprintln!("seed {seed}: {} writes acked, {checked} sectors checked, {durable} with a durable write, txg {}", model.acked.len(), pool.imported_txg());
        }
        pool.export().await.unwrap();
    });
    ahead_commits
}

/// Seeds of the mirror crash sweep (`IRONPOOL_CRASH_SEEDS`, default 24).
fn crash_seeds() -> u64 {
    std::env::var("IRONPOOL_CRASH_SEEDS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(24)
}

/// Runs the mirror crash sweep's seeds `seeds`. The sweep is two tests, each
/// half of the seeds, so that the test harness runs the halves on both cores.
fn crash_sweep(seeds: std::ops::RangeInclusive<u64>) {
    let count = seeds.clone().count();
    let mut ahead_commits = 0;
    for seed in seeds {
        ahead_commits += crash_run(seed, TopVdevKind::Mirror, 2);
    }
    // The lone client's seeds crashed with commits started ahead of its
    // FLUSHes, not only with FLUSHes' own.
    if count >= 3 {
        assert!(
            ahead_commits > 0,
            "no seed's client was logged ahead of its FLUSH"
        );
    }
}

#[test]
fn crash_at_random_points_keeps_every_flushed_write() {
    crash_sweep(1..=crash_seeds() / 2);
}

#[test]
fn crash_at_random_points_keeps_every_flushed_write_later_seeds() {
    crash_sweep(crash_seeds() / 2 + 1..=crash_seeds());
}

#[test]
fn crash_at_random_points_on_raidz_keeps_every_flushed_write() {
    let seeds = crash_seeds() / 6;
    for seed in 1..=seeds {
        for (kind, width) in [
            (TopVdevKind::Raidz1, 3),
            (TopVdevKind::Raidz2, 5),
            (TopVdevKind::Raidz3, 6),
        ] {
            let _ = crash_run(1000 + seed * 10 + kind.parity() as u64, kind, width);
        }
    }
}

/// A cache far smaller than one volume's indirect blocks: every load evicts.
/// Loading a path must keep the nodes it loaded (and their ancestors) until the
/// synchronous link that follows uses them; eviction once dropped the upper
/// node while loading the lower one, and the write failed with "not cached"
/// (found by ironpool-sim seed 1, mirror).
#[test]
fn writes_under_a_tiny_metadata_cache_keep_their_paths() {
    let disks = devices(2, DEVICE_BYTES, 77);
    let block_tag = |round: u64, index: u64| round * 1000 + index;
    {
        let runtime = Runtime::new_sim(77);
        runtime.block_on(async {
            let pool = mirror_pool(&disks).await;
            // 4 KiB blocks: 256 per level-1 block, so 64 MiB has a level 2.
            let volume = pool
                .create_volume("tank/vol", 64 << 20, 4096, BTreeMap::new())
                .await
                .unwrap();
            for index in 0..64u64 {
                pool.write(
                    &volume,
                    index << 20,
                    pattern(4096, block_tag(0, index)),
                    false,
                )
                .await
                .unwrap();
            }
            pool.export().await.unwrap();
        });
    }
    let runtime = Runtime::new_sim(78);
    runtime.block_on(async {
        // Cold cache, and room for barely one path: each load evicts.
        let tunables = PoolTunables {
            cache_budget_bytes: 64 << 10,
            ..tunables()
        };
        let pool = Pool::import_from_devices("tank", named(&disks), tunables)
            .await
            .unwrap();
        let volume = pool.volume("tank/vol").unwrap();
        for round in 1..3u64 {
            for index in 0..64u64 {
                pool.write(
                    &volume,
                    (index << 20) + round * 4096,
                    pattern(4096, block_tag(round, index)),
                    false,
                )
                .await
                .unwrap();
            }
            pool.commit().await.unwrap();
        }
        for round in 0..3u64 {
            for index in 0..64u64 {
                let data = ReadPiece::concat(
                    pool.read(&volume, (index << 20) + round * 4096, 4096)
                        .await
                        .unwrap(),
                );
                assert_eq!(
                    &data[..],
                    &pattern(4096, block_tag(round, index))[..],
                    "round {round} block {index}"
                );
            }
        }
        let report = pool.check_space().await.unwrap();
        assert!(report.problems.is_empty(), "{:?}", report.problems);
        pool.export().await.unwrap();
    });
}

/// The space check still finds real damage (it now holds writers and admin
/// changes off while it walks, which must not hide anything): space
/// allocated that no tree references (a leak), and a block a tree still
/// references whose space was freed.
#[test]
fn the_space_check_finds_a_leak_and_a_freed_block_still_referenced() {
    let disks = devices(2, DEVICE_BYTES, 7);
    let runtime = Runtime::new_sim(7);
    runtime.block_on(async {
        let pool = mirror_pool(&disks).await;
        let volume = pool
            .create_volume("tank/vol", 16 << 20, 16384, BTreeMap::new())
            .await
            .unwrap();
        for index in 0..32u64 {
            pool.write(&volume, index * 16384, pattern(16384, index), false)
                .await
                .unwrap();
        }
        let report = pool.check_space().await.unwrap();
        assert!(report.problems.is_empty(), "{:?}", report.problems);

        // A leak: allocated and logged, referenced by nothing.
        let leaked = pool
            .store()
            .allocator
            .borrow_mut()
            .allocate(16384, ironpool::alloc::BlockClass::Data, None)
            .unwrap();
        pool.store().allocator.borrow_mut().commit(leaked);
        let report = pool.check_space().await.unwrap();
        assert!(
            report
                .problems
                .iter()
                .any(|problem| problem.contains("leaked")),
            "{:?}",
            report.problems
        );
        pool.store().allocator.borrow_mut().free(leaked);

        // A referenced block freed.
        let pointer = pool
            .objects()
            .block_pointer(&volume.object, 5)
            .await
            .unwrap();
        assert!(!pointer.is_hole());
        pool.store().allocator.borrow_mut().free(pointer.dvas[0]);
        let report = pool.check_space().await.unwrap();
        assert!(
            report
                .problems
                .iter()
                .any(|problem| problem.contains("is not allocated")),
            "{:?}",
            report.problems
        );
    });
}

/// Every side of a mirror marked as having missed the txgs of some blocks
/// (as an import does for each device whose label missed the last txg, after
/// a crash in its commit) while the copies are in fact whole: a scrub must
/// verify the blocks from those copies, not call them unrecoverable (found
/// by ironpool-sim seed 11, mirror, with a receive step added).
#[test]
fn a_scrub_reads_copies_every_side_is_marked_as_missing() {
    let disks = devices(2, DEVICE_BYTES, 12);
    Runtime::new_sim(12).block_on(async {
        let pool = mirror_pool(&disks).await;
        let volume = pool
            .create_volume("tank/vol", 16 << 20, 16384, BTreeMap::new())
            .await
            .unwrap();
        for index in 0..16u64 {
            pool.write(&volume, index * 16384, pattern(16384, index), false)
                .await
                .unwrap();
        }
        pool.flush_all().await.unwrap();
        let txg = pool.txg().durable();
        for leaf in &pool.store().vdevs()[0].children {
            leaf.dtl.borrow_mut().add_range(1, txg);
        }
        pool.scrub_start().unwrap();
        pool.scrub_wait().await;
        let status = pool.scrub_status();
        assert_eq!(status.errors, 0, "{:?}", status.error_details);
        for index in 0..16u64 {
            let data = ReadPiece::concat(pool.read(&volume, index * 16384, 16384).await.unwrap());
            assert_eq!(&data[..], &pattern(16384, index)[..], "block {index}");
        }
        pool.export().await.unwrap();
    });
}

/// A tree-node read that began before a write changed the node, and ended
/// after the changed node was committed and evicted, cached the old contents
/// over the write: the written block then read back as a hole (found by
/// ironpool-sim seed 18, raidz3, under a send racing writes).
#[test]
fn a_slow_node_read_does_not_cache_an_outdated_node() {
    const BLOCK: u64 = 4096;
    // Blocks per level-1 node (32 KiB of 128-byte pointers).
    const SPAN: u64 = 256;
    let disks = devices(1, DEVICE_BYTES, 21);
    let tunables = PoolTunables {
        // Every load evicts what it can: clean, durable nodes go at once.
        cache_budget_bytes: 1,
        // Writes go through and link at once.
        dirty_data_max_bytes: 0,
        txg_timeout: Duration::from_secs(60),
        ..tunables()
    };
    Runtime::new_sim(21).block_on(async {
        let pool = Pool::create_on_devices(
            "tank",
            layout(&disks, TopVdevKind::Disk),
            false,
            tunables.clone(),
        )
        .await
        .unwrap();
        let volume = pool
            .create_volume("tank/vol", 64 << 20, BLOCK as u32, BTreeMap::new())
            .await
            .unwrap();
        for node in 0..8u64 {
            pool.write(
                &volume,
                node * SPAN * BLOCK,
                pattern(BLOCK as usize, node),
                false,
            )
            .await
            .unwrap();
        }
        pool.export().await.unwrap();
    });
    Runtime::new_sim(22).block_on(async {
        // Imported: no tree node is cached.
        let pool = Pool::import_from_devices("tank", named(&disks), tunables)
            .await
            .unwrap();
        let volume = pool.volume("tank/vol").unwrap();
        let read_other_nodes = || async {
            for node in 1..8u64 {
                pool.read(&volume, node * SPAN * BLOCK, BLOCK)
                    .await
                    .unwrap();
            }
        };
        read_other_nodes().await;
        // A read that needs the first level-1 node, on a slow device.
        disks[0].set_latency(SimLatency {
            minimum_us: 50_000,
            maximum_us: 50_000,
            spike_every: 0,
            spike_us: 0,
        });
        let reader = {
            let (pool, volume) = (pool.clone(), volume.clone());
            rt::spawn(async move { pool.read(&volume, BLOCK, BLOCK).await.map(|_| ()) })
        };
        rt::sleep(Duration::from_millis(1)).await;
        // Meanwhile the device is fast again: a write changes that node (its
        // own read of it ends first), the change is committed, and loads of
        // other nodes evict it, all before the slow read ends.
        disks[0].set_latency(SimLatency {
            minimum_us: 10,
            maximum_us: 10,
            spike_every: 0,
            spike_us: 0,
        });
        pool.write(&volume, 2 * BLOCK, pattern(BLOCK as usize, 99), false)
            .await
            .unwrap();
        pool.flush_all().await.unwrap();
        read_other_nodes().await;
        reader.await.unwrap();
        let data = ReadPiece::concat(pool.read(&volume, 2 * BLOCK, BLOCK).await.unwrap());
        assert!(
            data == *pattern(BLOCK as usize, 99),
            "the written block reads back as written"
        );
        pool.export().await.unwrap();
    });
}

/// A sequential stream of reads on a two-way mirror reads each block once:
/// the sides used to take turns block by block, and each side's queue then
/// aggregated across the blocks the other side took, reading the whole
/// stream from both. Both sides still share a long stream, and random
/// reads go to both.
#[test]
fn a_mirror_reads_a_sequential_stream_once_and_shares_it() {
    const BLOCK: u64 = 16384;
    const BLOCKS: u64 = 1024;
    let disks = devices(2, DEVICE_BYTES, 31);
    Runtime::new_sim(31).block_on(async {
        let pool = mirror_pool(&disks).await;
        let volume = pool
            .create_volume("tank/vol", BLOCKS * BLOCK, BLOCK as u32, BTreeMap::new())
            .await
            .unwrap();
        for first in (0..BLOCKS).step_by(64) {
            pool.write(
                &volume,
                first * BLOCK,
                pattern(64 * BLOCK as usize, first),
                false,
            )
            .await
            .unwrap();
        }
        pool.flush_all().await.unwrap();
        let leaves = pool.store().vdevs()[0].children.clone();
        let read_bytes = || -> Vec<u64> {
            leaves
                .iter()
                .map(|leaf| leaf.queue.stats().read_bytes)
                .collect()
        };
        // Bytes each side read from its device since `before`.
        let read_since = |before: &[u64]| -> Vec<u64> {
            read_bytes()
                .iter()
                .zip(before)
                .map(|(now, then)| now - then)
                .collect()
        };

        // 64 block reads in flight, in order, as `send` issues them.
        pool.store().cache.clear();
        let before = read_bytes();
        for first in (0..BLOCKS).step_by(64) {
            let reads = (first..first + 64).map(|block| {
                let pool = pool.clone();
                let volume = volume.clone();
                rt::spawn(async move { pool.read(&volume, block * BLOCK, BLOCK).await })
            });
            let reads: Vec<_> = reads.collect();
            for (index, read) in reads.into_iter().enumerate() {
                let data = ReadPiece::concat(read.await.unwrap());
                let block = first + index as u64;
                let tag = block - block % 64;
                let offset = ((block % 64) * BLOCK) as usize;
                assert_eq!(
                    &data[..],
                    &pattern(64 * BLOCK as usize, tag)[offset..offset + BLOCK as usize],
                    "block {block}"
                );
            }
        }
        let sides = read_since(&before);
        let total: u64 = sides.iter().sum();
        assert!(
            total <= BLOCKS * BLOCK * 11 / 10,
            "{total} bytes read from the devices for a {} byte stream (per side {sides:?})",
            BLOCKS * BLOCK
        );
        assert!(
            sides.iter().all(|side| *side >= BLOCKS * BLOCK / 8),
            "both sides share the stream: {sides:?}"
        );

        // Random single reads (no run to continue) go to both sides.
        pool.store().cache.clear();
        let before = read_bytes();
        let mut rng = Rng::new(31);
        for _ in 0..256 {
            let block = rng.below(BLOCKS);
            pool.read(&volume, block * BLOCK, BLOCK).await.unwrap();
        }
        let sides = read_since(&before);
        assert!(
            sides.iter().all(|side| *side >= 64 * BLOCK),
            "random reads are shared: {sides:?}"
        );
        pool.export().await.unwrap();
    });
}
