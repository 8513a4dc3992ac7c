//! A pool's shape changed while it is written, on simulated devices:
//! `attach` makes a disk a mirror with writes in flight (the vdev is swapped
//! under them), a crash lands right after an attach, before its resilver,
//! and `detach` leaves one side; at each step every flushed write reads back
//! from the device left alone, and the space accounting is whole. `split`
//! under writes and with a crash at any point leaves the original pool
//! whole and the new one, when it was made, a consistent copy.

mod sim_support;

use std::collections::BTreeMap;
use std::rc::Rc;

use ironpool::dev::sim::SimDevice;
use ironpool::dev::Device;
use ironpool::format::label::TopVdevKind;
use ironpool::pool::volume::ReadPiece;
use ironpool::pool::{NewDevice, NewTopVdev, Pool};
use ironpool::rt::sim::Rng;
use ironpool::rt::{self, Runtime};
use sim_support::{crash_all, devices, manual_commits, random_pattern};

const DEVICE_BYTES: u64 = 256 << 20;
const VOLUME_BYTES: u64 = 16 << 20;
const BLOCK: u64 = 16384;
const BLOCKS: u64 = VOLUME_BYTES / BLOCK;

/// Device `index` as the pool names it.
fn device(disks: &[Rc<SimDevice>], index: usize) -> NewDevice {
    NewDevice {
        path: format!("sim:d{index}"),
        device: disks[index].clone() as Rc<dyn Device>,
    }
}

/// Devices `indices` as an import finds them.
fn only(disks: &[Rc<SimDevice>], indices: &[usize]) -> Vec<(String, Rc<dyn Device>)> {
    indices
        .iter()
        .map(|&index| {
            let new = device(disks, index);
            (new.path, new.device)
        })
        .collect()
}

/// The tag block `blkid` holds: `tags` is the block's write history.
fn expected(tags: &BTreeMap<u64, u64>, blkid: u64) -> u64 {
    tags.get(&blkid).copied().unwrap_or(1) * 1_000_000 + blkid
}

async fn write_tagged(pool: &Rc<Pool>, blocks: impl Iterator<Item = u64>, tag: u64) {
    let volume = pool.volume("tank/v").unwrap();
    for blkid in blocks {
        let bytes = random_pattern(BLOCK as usize, tag * 1_000_000 + blkid);
        pool.write(&volume, blkid * BLOCK, bytes, false)
            .await
            .unwrap();
    }
}

async fn assert_tagged(pool: &Rc<Pool>, tags: &BTreeMap<u64, u64>, what: &str) {
    let volume = pool.volume("tank/v").unwrap();
    for blkid in 0..BLOCKS {
        let bytes = ReadPiece::concat(pool.read(&volume, blkid * BLOCK, BLOCK).await.unwrap());
        assert!(
            bytes == *random_pattern(BLOCK as usize, expected(tags, blkid)),
            "{what}: block {blkid} is not what was flushed"
        );
    }
    let report = pool.check_space().await.unwrap();
    assert!(report.problems.is_empty(), "{what}: {:?}", report.problems);
}

fn shape(pool: &Pool) -> Vec<(TopVdevKind, Vec<String>)> {
    pool.store()
        .vdevs()
        .iter()
        .map(|top| {
            let paths = top
                .children
                .iter()
                .map(|leaf| leaf.path.borrow().clone())
                .collect();
            (top.kind, paths)
        })
        .collect()
}

/// Pool "tank" of one vdev of `kind` on devices `indices`, with volume
/// `tank/v` written whole with tag 1 and flushed.
async fn tank_written(disks: &[Rc<SimDevice>], kind: TopVdevKind, indices: &[usize]) -> Rc<Pool> {
    let layout = vec![NewTopVdev {
        log: false,
        kind,
        devices: indices.iter().map(|&index| device(disks, index)).collect(),
    }];
    let pool = Pool::create_on_devices("tank", layout, false, manual_commits())
        .await
        .unwrap();
    pool.create_volume("tank/v", VOLUME_BYTES, BLOCK as u32, BTreeMap::new())
        .await
        .unwrap();
    write_tagged(&pool, 0..BLOCKS, 1).await;
    pool.flush_all().await.unwrap();
    pool
}

fn attach_write_crash_detach(seed: u64) {
    let disks = devices(3, DEVICE_BYTES, seed);
    let mut rng = Rng::new(seed);
    let mut tags = BTreeMap::new();
    // A disk; an attach while a writer runs; flushed; a crash.
    Runtime::new_sim(seed).block_on(async {
        let pool = tank_written(&disks, TopVdevKind::Disk, &[0]).await;
        let first = rng.below(BLOCKS / 2);
        let writer = {
            let pool = pool.clone();
            rt::spawn(async move { write_tagged(&pool, first..first + BLOCKS / 2, 2).await })
        };
        rt::sleep(std::time::Duration::from_micros(rng.below(2000))).await;
        pool.attach_device("sim:d0", device(&disks, 1), false)
            .await
            .unwrap();
        writer.await;
        for blkid in first..first + BLOCKS / 2 {
            tags.insert(blkid, 2);
        }
        pool.flush_all().await.unwrap();
        assert_eq!(
            shape(&pool),
            [(TopVdevKind::Mirror, vec!["sim:d0".into(), "sim:d1".into()])]
        );
        crash_all(&disks, &mut rng);
    });
    // Imported, resilvered, d0 detached: everything is on d1.
    Runtime::new_sim(seed + 1).block_on(async {
        let pool = Pool::import_from_devices("tank", only(&disks, &[0, 1]), manual_commits())
            .await
            .unwrap();
        pool.resilver_wait().await;
        assert_tagged(&pool, &tags, "after the attach and a crash").await;
        pool.detach_device("sim:d0").await.unwrap();
        pool.export().await.unwrap();
    });
    Runtime::new_sim(seed + 2).block_on(async {
        let pool = Pool::import_from_devices("tank", only(&disks, &[1]), manual_commits())
            .await
            .unwrap();
        assert_eq!(shape(&pool), [(TopVdevKind::Disk, vec!["sim:d1".into()])]);
        assert_tagged(&pool, &tags, "d1 alone").await;
        // d2 attached, written to, and a crash before its resilver ends.
        pool.attach_device("sim:d1", device(&disks, 2), false)
            .await
            .unwrap();
        let first = rng.below(BLOCKS / 2);
        write_tagged(&pool, first..first + BLOCKS / 4, 3).await;
        for blkid in first..first + BLOCKS / 4 {
            tags.insert(blkid, 3);
        }
        pool.flush_all().await.unwrap();
        crash_all(&disks, &mut rng);
    });
    Runtime::new_sim(seed + 3).block_on(async {
        let pool = Pool::import_from_devices("tank", only(&disks, &[1, 2]), manual_commits())
            .await
            .unwrap();
        pool.resilver_wait().await;
        pool.detach_device("sim:d1").await.unwrap();
        assert_tagged(&pool, &tags, "after the second attach and a crash").await;
        pool.export().await.unwrap();
    });
    Runtime::new_sim(seed + 4).block_on(async {
        let pool = Pool::import_from_devices("tank", only(&disks, &[2]), manual_commits())
            .await
            .unwrap();
        assert_tagged(&pool, &tags, "d2 alone").await;
        // The last side cannot leave.
        let error = pool.detach_device("sim:d2").await.unwrap_err();
        assert!(
            error.to_string().contains("only a mirror's side"),
            "{error}"
        );
        pool.export().await.unwrap();
    });
}

#[test]
fn attach_under_writes_and_crashes_then_detach_keeps_every_flushed_write() {
    for seed in 1..=6 {
        attach_write_crash_detach(seed);
    }
}

/// Block `blkid` as read, against the versions it may hold: `Some(tag)` of
/// the first that matches.
async fn tag_of(pool: &Rc<Pool>, blkid: u64, candidates: &[u64]) -> Option<u64> {
    let volume = pool.volume(&format!("{}/v", pool.name())).unwrap();
    let bytes = ReadPiece::concat(pool.read(&volume, blkid * BLOCK, BLOCK).await.unwrap());
    candidates
        .iter()
        .copied()
        .find(|tag| bytes == *random_pattern(BLOCK as usize, tag * 1_000_000 + blkid))
}

/// The versions block `blkid` may hold: 2 only where the writer racing the
/// split wrote.
fn versions(racing: &std::ops::Range<u64>, blkid: u64) -> &'static [u64] {
    if racing.contains(&blkid) {
        &[1, 2]
    } else {
        &[1]
    }
}

/// Every block holds a version written to it ([`versions`]) and the space
/// accounting is whole.
async fn assert_versions(pool: &Rc<Pool>, racing: &std::ops::Range<u64>, what: &str) {
    for blkid in 0..BLOCKS {
        assert!(
            tag_of(pool, blkid, versions(racing, blkid)).await.is_some(),
            "{what}: block {blkid} is no version written"
        );
    }
    let report = pool.check_space().await.unwrap();
    assert!(report.problems.is_empty(), "{what}: {:?}", report.problems);
}

/// A mirror written, split while a writer runs, the writes flushed after
/// the split; then a crash, either at the end or at a random point inside
/// the split (`crash_inside`). The original imports from the side it kept
/// (both sides when the split did not get as far as leaving it) with every
/// flushed write; the new pool, when its devices hold it, imports alone
/// with every write flushed before the split and, for each block written
/// during it, one whole version.
fn split_under_writes(seed: u64, crash_inside: bool) {
    let disks = devices(2, DEVICE_BYTES, seed);
    let mut rng = Rng::new(seed);
    let mut tags = BTreeMap::new();
    let racing_first = rng.below(BLOCKS / 2);
    let racing = racing_first..racing_first + BLOCKS / 4;
    let split_ended = Runtime::new_sim(seed).block_on(async {
        let pool = tank_written(&disks, TopVdevKind::Mirror, &[0, 1]).await;
        let writer = {
            let pool = pool.clone();
            let racing = racing.clone();
            rt::spawn(async move { write_tagged(&pool, racing, 2).await })
        };
        let split = {
            let pool = pool.clone();
            rt::spawn(async move { pool.split("tank2", &[]).await })
        };
        if crash_inside {
            // A split of this pool takes about 3 ms of simulated time.
            rt::sleep(std::time::Duration::from_micros(rng.below(4_000))).await;
            crash_all(&disks, &mut rng);
            return false;
        }
        writer.await;
        let outcome = split.await.unwrap();
        assert_eq!(outcome.devices, ["sim:d1"]);
        for blkid in racing.clone() {
            tags.insert(blkid, 2);
        }
        pool.flush_all().await.unwrap();
        assert_eq!(shape(&pool), [(TopVdevKind::Disk, vec!["sim:d0".into()])]);
        crash_all(&disks, &mut rng);
        true
    });
    Runtime::new_sim(seed + 1).block_on(async {
        let pool = Pool::import_from_devices("tank", only(&disks, &[0, 1]), manual_commits())
            .await
            .unwrap();
        if split_ended {
            assert_eq!(shape(&pool), [(TopVdevKind::Disk, vec!["sim:d0".into()])]);
            assert_tagged(&pool, &tags, "the original after the split").await;
        } else {
            // Whatever the split reached, the writes flushed before it.
            let what = format!("seed {seed}: the original after a crash inside the split");
            assert_versions(&pool, &racing, &what).await;
        }
        pool.export().await.unwrap();
    });
    Runtime::new_sim(seed + 2).block_on(async {
        let imported =
            Pool::import_from_devices("tank2", only(&disks, &[1]), manual_commits()).await;
        let pool = match imported {
            Ok(pool) => pool,
            // A crash before the new pool's uberblock: no pool there.
            Err(_) if !split_ended => return,
            Err(error) => panic!("seed {seed}: the new pool does not import: {error}"),
        };
        assert_eq!(shape(&pool), [(TopVdevKind::Disk, vec!["sim:d1".into()])]);
        assert_versions(&pool, &racing, &format!("seed {seed}: the new pool")).await;
        pool.export().await.unwrap();
    });
}

#[test]
fn split_under_writes_and_crashes_keeps_both_pools_consistent() {
    for seed in 1..=6 {
        split_under_writes(seed, false);
    }
    for seed in 100..124 {
        split_under_writes(seed, true);
    }
}

/// A mirror with a hot spare; one side stops answering while the pool is
/// written: the leaf faults, the spare takes its place on its own and is
/// resilvered, every flushed write reads back from the other side and the
/// spare, and an import without the failed device finds the spare in use.
fn spare_replaces_a_failing_side(seed: u64) {
    let disks = devices(3, DEVICE_BYTES, seed);
    let mut rng = Rng::new(seed);
    let mut tags = BTreeMap::new();
    Runtime::new_sim(seed).block_on(async {
        let pool = tank_written(&disks, TopVdevKind::Mirror, &[0, 1]).await;
        pool.add_spares(vec![device(&disks, 2)], false)
            .await
            .unwrap();
        // d1 goes away under writes: its errors fault it.
        disks[1].set_offline(true);
        let first = rng.below(BLOCKS / 2);
        write_tagged(&pool, first..first + BLOCKS / 2, 2).await;
        for blkid in first..first + BLOCKS / 2 {
            tags.insert(blkid, 2);
        }
        pool.flush_all().await.unwrap();
        // The activation runs after a commit; wait for it and its resilver.
        let mut rounds = 0;
        let whole = |pool: &Rc<Pool>| {
            pool.store().vdevs()[0]
                .children
                .iter()
                .all(|leaf| leaf.is_online() && leaf.dtl.borrow().is_empty())
        };
        while !whole(&pool) {
            rounds += 1;
            assert!(rounds < 3000, "seed {seed}: no spare took d1's place");
            pool.commit().await.unwrap();
            pool.resilver_wait().await;
            rt::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(
            shape(&pool),
            [(TopVdevKind::Mirror, vec!["sim:d0".into(), "sim:d2".into()])]
        );
        let spares = pool.spares_status();
        assert_eq!(spares.len(), 1);
        assert_eq!(spares[0].state, "in use");
        assert_eq!(spares[0].replacing.as_deref(), Some("sim:d1"));
        assert_tagged(&pool, &tags, "with the spare in place").await;
        pool.export().await.unwrap();
    });
    // The spare alone holds everything.
    Runtime::new_sim(seed + 1).block_on(async {
        let pool = Pool::import_from_devices("tank", only(&disks, &[2, 0]), manual_commits())
            .await
            .unwrap();
        pool.offline_device("sim:d0").await.unwrap();
        assert_tagged(&pool, &tags, "the spare alone").await;
        pool.online_device("sim:d0", None).await.unwrap();
        assert_eq!(pool.spares_status()[0].state, "in use");
        pool.export().await.unwrap();
    });
}

#[test]
fn a_spare_replaces_a_failing_side_on_its_own() {
    for seed in 1..=4 {
        spare_replaces_a_failing_side(seed);
    }
}

/// A disk of a pool of a disk and a mirror is removed while a writer runs,
/// with a snapshot and a clone sharing its blocks and a crash at a drawn
/// moment of the removal: the import resumes it, every flushed write reads
/// back (the volume, the snapshot and the clone), `check` finds the space
/// whole, a scrub finds nothing wrong, and the pool then imports without
/// the removed disk at all.
fn remove_write_crash(seed: u64) {
    let disks = devices(3, DEVICE_BYTES, seed);
    let mut rng = Rng::new(seed);
    let mut tags = BTreeMap::new();
    Runtime::new_sim(seed).block_on(async {
        let pool = tank_written(&disks, TopVdevKind::Disk, &[0]).await;
        pool.add_vdevs(
            vec![NewTopVdev {
                log: false,
                kind: TopVdevKind::Mirror,
                devices: vec![device(&disks, 1), device(&disks, 2)],
            }],
            false,
        )
        .await
        .unwrap();
        // Blocks on both vdevs, a snapshot holding the first version and a
        // clone of it.
        pool.snapshot(&["tank/v@one".to_string()]).await.unwrap();
        pool.clone_snapshot("tank/v@one", "tank/c").await.unwrap();
        write_tagged(&pool, 0..BLOCKS / 2, 2).await;
        for blkid in 0..BLOCKS / 2 {
            tags.insert(blkid, 2);
        }
        pool.flush_all().await.unwrap();
        let first = rng.below(BLOCKS / 2);
        let writer = {
            let pool = pool.clone();
            rt::spawn(async move { write_tagged(&pool, first..first + BLOCKS / 4, 3).await })
        };
        rt::sleep(std::time::Duration::from_micros(rng.below(2000))).await;
        pool.remove_vdev("disk-0").await.unwrap();
        writer.await;
        for blkid in first..first + BLOCKS / 4 {
            tags.insert(blkid, 3);
        }
        pool.flush_all().await.unwrap();
        // Commits as the txg timer makes them, so that part of the mapping
        // is on disk when the crash lands somewhere in the removal (or
        // after its end).
        let _committer = {
            let pool = pool.clone();
            rt::spawn(async move {
                while pool.commit().await.is_ok() {
                    rt::sleep(std::time::Duration::from_millis(1)).await;
                }
            })
        };
        rt::sleep(std::time::Duration::from_micros(rng.below(15_000))).await;
        crash_all(&disks, &mut rng);
    });
    Runtime::new_sim(seed + 1).block_on(async {
        let pool = Pool::import_from_devices("tank", only(&disks, &[0, 1, 2]), manual_commits())
            .await
            .unwrap();
        pool.removal_wait().await;
        let status = pool.removal_status();
        assert_eq!(status.state, "none", "{status:?}");
        assert_eq!(status.removed.len(), 1, "{status:?}");
        assert_tagged(&pool, &tags, "after the removal").await;
        assert_eq!(
            shape(&pool),
            [
                (TopVdevKind::Indirect, vec![]),
                (TopVdevKind::Mirror, vec!["sim:d1".into(), "sim:d2".into()])
            ]
        );
        pool.scrub_start().unwrap();
        pool.scrub_wait().await;
        let scrub = pool.scrub_status();
        assert!(
            scrub.errors == 0 && scrub.bad_copies == 0,
            "scrub after the removal: {scrub:?}"
        );
        pool.export().await.unwrap();
    });
    // The removed disk is not needed any more (and no longer the pool's).
    Runtime::new_sim(seed + 2).block_on(async {
        let pool = Pool::import_from_devices("tank", only(&disks, &[1, 2]), manual_commits())
            .await
            .unwrap();
        assert_tagged(&pool, &tags, "without the removed disk").await;
        let snapshot = pool.volume("tank/c").unwrap();
        for blkid in 0..BLOCKS {
            let bytes =
                ReadPiece::concat(pool.read(&snapshot, blkid * BLOCK, BLOCK).await.unwrap());
            assert!(
                bytes == *random_pattern(BLOCK as usize, expected(&BTreeMap::new(), blkid)),
                "the clone's block {blkid} is not the snapshot's"
            );
        }
        // Writes go on, and frees of moved blocks give their space back.
        write_tagged(&pool, 0..BLOCKS, 4).await;
        pool.destroy_volume("tank/c", false).await.unwrap();
        pool.flush_all().await.unwrap();
        let report = pool.check_space().await.unwrap();
        assert!(report.problems.is_empty(), "{:?}", report.problems);
        pool.export().await.unwrap();
    });
    let disk0 = Runtime::new_sim(seed + 3).block_on(async {
        Pool::import_from_devices("tank", only(&disks, &[0]), manual_commits())
            .await
            .map(|_| ())
    });
    assert!(disk0.is_err(), "the removed disk still imports as the pool");
}

#[test]
fn removing_a_disk_under_writes_and_a_crash_keeps_every_flushed_write() {
    for seed in 1..=8 {
        remove_write_crash(seed);
    }
}

/// `remove -s` in the middle of a removal gives the moved copies back and
/// leaves the vdev in use; the refusals change nothing.
#[test]
fn a_stopped_removal_leaves_the_vdev_whole_and_the_space_accounted() {
    let seed = 7;
    let disks = devices(4, DEVICE_BYTES, seed);
    Runtime::new_sim(seed).block_on(async {
        let pool = tank_written(&disks, TopVdevKind::Disk, &[0]).await;
        // The only data vdev has nowhere to send its blocks.
        let error = pool.remove_vdev("disk-0").await.unwrap_err();
        assert!(error.to_string().contains("only data vdev"), "{error}");
        pool.add_vdevs(
            vec![NewTopVdev {
                log: false,
                kind: TopVdevKind::Raidz1,
                devices: vec![device(&disks, 1), device(&disks, 2), device(&disks, 3)],
            }],
            false,
        )
        .await
        .unwrap();
        let error = pool.remove_vdev("raidz1-1").await.unwrap_err();
        assert!(error.to_string().contains("RAID-Z"), "{error}");
        let mut tags = BTreeMap::new();
        write_tagged(&pool, 0..BLOCKS / 2, 2).await;
        for blkid in 0..BLOCKS / 2 {
            tags.insert(blkid, 2);
        }
        pool.flush_all().await.unwrap();
        pool.remove_vdev("sim:d0").await.unwrap();
        let error = pool.remove_vdev("raidz1-1").await.unwrap_err();
        assert!(error.to_string().contains("being removed"), "{error}");
        // Stopped in the middle: some copies made, not all.
        while pool.removal_status().moved_blocks < 100 {
            rt::sleep(std::time::Duration::from_micros(200)).await;
        }
        pool.removal_stop().await.unwrap();
        let status = pool.removal_status();
        assert_eq!(status.state, "stopped", "{status:?}");
        assert!(status.removed.is_empty(), "{status:?}");
        // Copies were made, and given back (`check_space` below).
        assert!(
            status.moved_blocks >= 100 && status.progress_percent < 100.0,
            "{status:?}"
        );
        assert_eq!(
            status.error.as_deref(),
            Some("stopped by the operator"),
            "{status:?}"
        );
        assert_eq!(shape(&pool)[0].0, TopVdevKind::Disk);
        pool.commit().await.unwrap();
        assert_tagged(&pool, &tags, "after a stopped removal").await;
        // The vdev takes blocks again.
        write_tagged(&pool, 0..BLOCKS, 3).await;
        pool.flush_all().await.unwrap();
        let allocated = pool.store().allocator.borrow().vdevs[0]
            .live_ranges()
            .total_bytes();
        assert!(allocated > 0);
        pool.export().await.unwrap();
    });
    Runtime::new_sim(seed + 1).block_on(async {
        let pool = Pool::import_from_devices("tank", only(&disks, &[0, 1, 2, 3]), manual_commits())
            .await
            .unwrap();
        assert_eq!(pool.removal_status().state, "none");
        let report = pool.check_space().await.unwrap();
        assert!(report.problems.is_empty(), "{:?}", report.problems);
        pool.export().await.unwrap();
    });
}

/// A removal while a writer overwrites the blocks being moved, committing
/// as it goes: blocks freed before, while and after they are moved give
/// all their space back (a copy freed in the middle of its move is not
/// recorded), and what was last written reads back.
#[test]
fn blocks_overwritten_while_they_move_leave_no_space_behind() {
    for seed in 11..=13 {
        let disks = devices(2, DEVICE_BYTES, seed);
        Runtime::new_sim(seed).block_on(async {
            let pool = tank_written(&disks, TopVdevKind::Disk, &[0]).await;
            pool.add_vdevs(
                vec![NewTopVdev {
                    log: false,
                    kind: TopVdevKind::Disk,
                    devices: vec![device(&disks, 1)],
                }],
                false,
            )
            .await
            .unwrap();
            pool.remove_vdev("disk-0").await.unwrap();
            let mut tags = BTreeMap::new();
            for round in 2..=5 {
                write_tagged(&pool, 0..BLOCKS, round).await;
                pool.commit().await.unwrap();
                for blkid in 0..BLOCKS {
                    tags.insert(blkid, round);
                }
            }
            pool.removal_wait().await;
            let status = pool.removal_status();
            assert_eq!(status.removed.len(), 1, "{status:?}");
            assert_tagged(&pool, &tags, "after moves under overwrites").await;
            pool.export().await.unwrap();
        });
    }
}

/// A side of the mirror being removed stops answering in the middle of the
/// removal: the removal reads the other side, a hot spare takes the failed
/// side's place (and is resilvered) as it would anywhere, and when the
/// mirror leaves the pool the spare is available again; nothing written is
/// lost, and the pool imports from the devices left and the spare.
#[test]
fn a_side_failing_during_a_removal_loses_nothing_and_the_spare_comes_back() {
    for seed in 21..=23 {
        let disks = devices(4, DEVICE_BYTES, seed);
        let mut rng = Rng::new(seed);
        let mut tags = BTreeMap::new();
        Runtime::new_sim(seed).block_on(async {
            let pool = tank_written(&disks, TopVdevKind::Mirror, &[0, 1]).await;
            pool.add_vdevs(
                vec![NewTopVdev {
                    log: false,
                    kind: TopVdevKind::Disk,
                    devices: vec![device(&disks, 2)],
                }],
                false,
            )
            .await
            .unwrap();
            pool.add_spares(vec![device(&disks, 3)], false)
                .await
                .unwrap();
            pool.remove_vdev("mirror-0").await.unwrap();
            rt::sleep(std::time::Duration::from_micros(rng.below(3000))).await;
            disks[1].set_offline(true);
            write_tagged(&pool, 0..BLOCKS / 2, 2).await;
            for blkid in 0..BLOCKS / 2 {
                tags.insert(blkid, 2);
            }
            pool.flush_all().await.unwrap();
            pool.removal_wait().await;
            let status = pool.removal_status();
            assert_eq!(status.removed.len(), 1, "seed {seed}: {status:?}");
            assert_eq!(
                shape(&pool),
                [
                    (TopVdevKind::Indirect, vec![]),
                    (TopVdevKind::Disk, vec!["sim:d2".into()])
                ]
            );
            let spares = pool.spares_status();
            assert_eq!(spares.len(), 1);
            assert_eq!(spares[0].state, "available", "seed {seed}: {spares:?}");
            // The spare did stand in for d1, and came back with the removal.
            let events = pool.events().since(0, usize::MAX).events;
            let said = |device: &str, words: &str| {
                events.iter().any(|event| {
                    event.device.as_deref() == Some(device) && event.detail.contains(words)
                })
            };
            assert!(
                said("sim:d3", "available again"),
                "seed {seed}: {:?}",
                events
                    .iter()
                    .map(|event| (&event.device, &event.detail))
                    .collect::<Vec<_>>()
            );
            assert_tagged(&pool, &tags, "after the removal with a failed side").await;
            pool.export().await.unwrap();
        });
        Runtime::new_sim(seed + 1).block_on(async {
            let pool = Pool::import_from_devices("tank", only(&disks, &[2, 3]), manual_commits())
                .await
                .unwrap();
            assert_eq!(pool.spares_status()[0].state, "available");
            assert_tagged(&pool, &tags, "from the devices left").await;
            pool.export().await.unwrap();
        });
    }
}
