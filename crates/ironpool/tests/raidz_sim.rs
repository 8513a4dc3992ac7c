//! RAID-Z (and mirror) pools on simulated devices, deterministic from seeds:
//! losing up to parity devices, corrupted columns, p+1 failures, seeded faults
//! while a workload runs, offline/online with resilver of only what was missed,
//! and replace.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use ironpool::dev::sim::{SimDevice, SimFaults};
use ironpool::dev::Device;
use ironpool::format::label::TopVdevKind;
use ironpool::format::DATA_START_BYTES;
use ironpool::pool::volume::ReadPiece;
use ironpool::pool::{NewDevice, NewTopVdev, Pool, PoolError, PoolTunables};
use ironpool::rt::buf::{AlignedBuf, BufSlice};
use ironpool::rt::sim::Rng;
use ironpool::rt::Runtime;
use ironpool::vdev::LeafState;

const DEVICE_BYTES: u64 = 128 << 20;
const VOLUME_BYTES: u64 = 24 << 20;

fn devices(count: usize, seed: u64) -> Vec<Rc<SimDevice>> {
    (0..count)
        .map(|index| {
            SimDevice::new(
                &format!("d{index}"),
                DEVICE_BYTES,
                seed * 100 + index as u64,
            )
        })
        .collect()
}

fn name(index: usize) -> String {
    format!("sim:d{index}")
}

fn layout(devices: &[Rc<SimDevice>], kind: TopVdevKind) -> Vec<NewTopVdev> {
    vec![NewTopVdev {
        log: false,
        kind,
        devices: devices
            .iter()
            .enumerate()
            .map(|(index, device)| NewDevice {
                path: name(index),
                device: device.clone() as Rc<dyn Device>,
            })
            .collect(),
    }]
}

/// The devices except those in `without`, as import takes them.
fn present(devices: &[Rc<SimDevice>], without: &[usize]) -> Vec<(String, Rc<dyn Device>)> {
    devices
        .iter()
        .enumerate()
        .filter(|(index, _)| !without.contains(index))
        .map(|(index, device)| (name(index), device.clone() as Rc<dyn Device>))
        .collect()
}

fn tunables() -> PoolTunables {
    PoolTunables {
        txg_timeout: Duration::from_millis(50),
        ..PoolTunables::default()
    }
}

fn pattern(length: usize, tag: u64) -> BufSlice {
    let mut buffer = AlignedBuf::zeroed(length);
    Rng::new(tag.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1).fill(&mut buffer);
    BufSlice::whole(buffer.into_shared())
}

/// A model of what the volume holds: (offset, length, tag) writes, later ones
/// winning.
#[derive(Default, Clone)]
struct Written {
    writes: Vec<(u64, usize, u64)>,
}

impl Written {
    fn expected(&self) -> Vec<u8> {
        let mut image = vec![0u8; VOLUME_BYTES as usize];
        for (offset, length, tag) in &self.writes {
            image[*offset as usize..*offset as usize + length]
                .copy_from_slice(&pattern(*length, *tag));
        }
        image
    }
}

/// Writes `count` pieces of assorted sizes (whole blocks, partial blocks,
/// multi-block) at seeded offsets.
async fn write_some(pool: &Rc<Pool>, written: &mut Written, rng: &mut Rng, count: usize) {
    let volume = pool.volume("tank/vol").unwrap();
    for _ in 0..count {
        let length = [4096usize, 16384, 12288, 65536, 131072, 512 * 3][rng.below(6) as usize];
        let offset = rng.below((VOLUME_BYTES - length as u64) / 512) * 512;
        let tag = rng.next_u64();
        pool.write(&volume, offset, pattern(length, tag), false)
            .await
            .unwrap();
        written.writes.push((offset, length, tag));
    }
    pool.flush_all().await.unwrap();
}

/// Reads the whole volume and compares it with the model.
async fn assert_intact(pool: &Rc<Pool>, written: &Written, context: &str) {
    let volume = pool.volume("tank/vol").unwrap();
    let expected = written.expected();
    let chunk = 1 << 20;
    for start in (0..VOLUME_BYTES).step_by(chunk) {
        let data = ReadPiece::concat(
            pool.read(&volume, start, chunk as u64)
                .await
                .unwrap_or_else(|error| panic!("{context}: read at {start:#x}: {error}")),
        );
        assert!(
            data == expected[start as usize..start as usize + chunk],
            "{context}: wrong data in the MiB at {start:#x}"
        );
    }
}

async fn new_pool(disks: &[Rc<SimDevice>], kind: TopVdevKind) -> Rc<Pool> {
    let pool = Pool::create_on_devices("tank", layout(disks, kind), false, tunables())
        .await
        .unwrap();
    pool.create_volume("tank/vol", VOLUME_BYTES, 16384, BTreeMap::new())
        .await
        .unwrap();
    pool
}

async fn scrub(pool: &Rc<Pool>) -> ironpool::pool::scan::scrub::ScrubStatus {
    pool.scrub_start().unwrap();
    pool.scrub_wait().await;
    pool.scrub_status()
}

fn raidz_kinds() -> [(TopVdevKind, usize); 3] {
    [
        (TopVdevKind::Raidz1, 4),
        (TopVdevKind::Raidz2, 6),
        (TopVdevKind::Raidz3, 7),
    ]
}

#[test]
fn losing_any_parity_devices_keeps_every_byte_and_one_more_is_refused_without_a_write() {
    for (kind, width) in raidz_kinds() {
        let parity = kind.parity() as usize;
        let seed = 10 + parity as u64;
        let disks = devices(width, seed);
        let mut rng = Rng::new(seed);
        let mut written = Written::default();
        Runtime::new_sim(seed).block_on(async {
            let pool = new_pool(&disks, kind).await;
            write_some(&pool, &mut written, &mut rng, 120).await;
            assert_intact(&pool, &written, "healthy").await;
            pool.export().await.unwrap();
        });
        // Several choices of `parity` devices gone.
        for round in 0..3u64 {
            let mut gone: Vec<usize> = Vec::new();
            while gone.len() < parity {
                let candidate = rng.below(width as u64) as usize;
                if !gone.contains(&candidate) {
                    gone.push(candidate);
                }
            }
            let context = format!("{kind:?} without {gone:?}");
            Runtime::new_sim(seed * 10 + round).block_on(async {
                let pool = Pool::import_from_devices("tank", present(&disks, &gone), tunables())
                    .await
                    .unwrap_or_else(|error| panic!("{context}: {error}"));
                assert_eq!(pool.health(), "DEGRADED", "{context}");
                assert_intact(&pool, &written, &context).await;
                // Degraded pools take writes too.
                write_some(&pool, &mut written, &mut rng, 20).await;
                assert_intact(&pool, &written, &context).await;
                let report = pool.check_space().await.unwrap();
                assert!(
                    report.problems.is_empty(),
                    "{context}: {:?}",
                    report.problems
                );
                pool.export().await.unwrap();
            });
            // Put them back: the returning devices catch up by resilver.
            Runtime::new_sim(seed * 20 + round).block_on(async {
                let pool = Pool::import_from_devices("tank", present(&disks, &[]), tunables())
                    .await
                    .unwrap();
                pool.resilver_wait().await;
                assert_eq!(pool.resilver_status().errors, 0, "{context}");
                assert_eq!(pool.health(), "ONLINE", "{context}: resilvered");
                let status = scrub(&pool).await;
                assert_eq!(
                    (status.errors, status.bad_copies),
                    (0, 0),
                    "{context}: {:?}",
                    status.error_details
                );
                pool.export().await.unwrap();
            });
        }
        // One more than parity: refused, naming the devices, and nothing written.
        let gone: Vec<usize> = (0..=parity).collect();
        let writes_before: Vec<u64> = disks.iter().map(|disk| disk.counters().writes).collect();
        Runtime::new_sim(seed + 1000).block_on(async {
            let error = Pool::import_from_devices("tank", present(&disks, &gone), tunables())
                .await
                .err()
                .expect("import must be refused");
            let PoolError::MissingDevices { devices, .. } = &error else {
                panic!("{error}")
            };
            for index in &gone {
                assert!(devices.contains(&name(*index)), "{error}");
            }
            assert!(
                error
                    .to_string()
                    .contains(&format!("can lose at most {parity}")),
                "{error}"
            );
        });
        let writes_after: Vec<u64> = disks.iter().map(|disk| disk.counters().writes).collect();
        assert_eq!(
            writes_before, writes_after,
            "a refused import writes nothing"
        );
    }
}

#[test]
fn corrupt_sectors_in_up_to_parity_devices_are_read_correctly_and_repaired() {
    for (kind, width) in raidz_kinds() {
        let parity = kind.parity() as usize;
        let seed = 20 + parity as u64;
        let disks = devices(width, seed);
        let mut rng = Rng::new(seed);
        let mut written = Written::default();
        Runtime::new_sim(seed).block_on(async {
            let pool = new_pool(&disks, kind).await;
            write_some(&pool, &mut written, &mut rng, 150).await;
            pool.export().await.unwrap();
        });
        // Damage a third of the first 16 MiB of the data area of the last
        // `parity` devices (where the data columns of most blocks are): every
        // block loses at most `parity` columns.
        for disk in disks.iter().skip(width - parity) {
            for _ in 0..1500 {
                let sector = rng.below(4096);
                disk.corrupt(DATA_START_BYTES + sector * 4096, 4096, &mut rng);
            }
        }
        Runtime::new_sim(seed + 1).block_on(async {
            let pool = Pool::import_from_devices("tank", present(&disks, &[]), tunables())
                .await
                .unwrap();
            assert_intact(&pool, &written, &format!("{kind:?} corrupted")).await;
            let checksum_errors: u64 = pool.store().vdevs()[0]
                .children
                .iter()
                .map(|child| child.queue.stats().checksum_errors)
                .sum();
            let reads: Vec<u64> = pool.store().vdevs()[0]
                .children
                .iter()
                .map(|child| child.queue.stats().read_requests)
                .collect();
            assert!(
                checksum_errors > 0,
                "{kind:?}: damage was found and counted (reads {reads:?}, healed {:?})",
                pool.store().stats()
            );
            pool.store().repairs_quiesced().await;
            let first = scrub(&pool).await;
            assert_eq!(first.errors, 0, "{kind:?}: {:?}", first.error_details);
            let second = scrub(&pool).await;
            assert_eq!(
                (second.errors, second.bad_copies),
                (0, 0),
                "{kind:?}: the first scrub repaired everything: {:?}",
                second.error_details
            );
            let repaired: u64 = pool.store().vdevs()[0]
                .children
                .iter()
                .skip(width - parity)
                .map(|child| child.queue.stats().repaired_bytes)
                .sum();
            assert!(repaired > 0);
            pool.export().await.unwrap();
        });
        // Now the other devices can fail: the damaged ones hold good columns again.
        let gone: Vec<usize> = (0..parity).collect();
        Runtime::new_sim(seed + 2).block_on(async {
            let pool = Pool::import_from_devices("tank", present(&disks, &gone), tunables())
                .await
                .unwrap();
            assert_intact(
                &pool,
                &written,
                &format!("{kind:?} repaired, without {gone:?}"),
            )
            .await;
            pool.export().await.unwrap();
        });
    }
}

#[test]
fn more_failures_than_parity_at_run_time_fail_reads_and_never_return_wrong_data() {
    let disks = devices(4, 30);
    let mut rng = Rng::new(30);
    let mut written = Written::default();
    Runtime::new_sim(30).block_on(async {
        let pool = new_pool(&disks, TopVdevKind::Raidz1).await;
        write_some(&pool, &mut written, &mut rng, 60).await;
        // Two of four devices return garbage: most blocks cannot be rebuilt.
        for disk in disks.iter().take(2) {
            disk.corrupt(DATA_START_BYTES, 24 << 20, &mut rng);
        }
        let volume = pool.volume("tank/vol").unwrap();
        let expected = written.expected();
        let (mut good, mut failed) = (0, 0);
        for start in (0..VOLUME_BYTES).step_by(16384) {
            match pool.read(&volume, start, 16384).await {
                Ok(pieces) => {
                    assert!(
                        ReadPiece::concat(pieces)
                            == expected[start as usize..start as usize + 16384],
                        "wrong data returned at {start:#x}"
                    );
                    good += 1;
                }
                Err(_) => failed += 1,
            }
        }
        assert!(
            failed > 0,
            "the damage must be detected ({good} blocks read)"
        );
        assert!(pool.store().stats().unrecoverable_reads > 0);
    });
}

/// Reads and writes from several tasks while devices misbehave (read errors,
/// corrupted reads, corrupted writes on up to parity devices, one of them
/// vanishing for a while); every read must return what was written.
fn faults_run(kind: TopVdevKind, width: usize, seed: u64) {
    let parity = kind.parity() as usize;
    let disks = devices(width, seed);
    let mut rng = Rng::new(seed);
    Runtime::new_sim(seed).block_on(async {
        let pool = new_pool(&disks, kind).await;
        let mut written = Written::default();
        write_some(&pool, &mut written, &mut rng, 40).await;
        let faulty: Vec<usize> = (0..parity)
            .map(|step| (seed as usize + step * 3) % width)
            .collect();
        let mut faulty = faulty;
        faulty.sort_unstable();
        faulty.dedup();
        for index in &faulty {
            disks[*index].set_faults(SimFaults {
                read_error_ppm: 30_000,
                read_corruption_ppm: 30_000,
                write_corruption_ppm: 20_000,
                ..SimFaults::default()
            });
        }
        let volume = pool.volume("tank/vol").unwrap();
        for round in 0..6 {
            if round == 2 {
                // One faulty device vanishes: it is faulted after its I/Os fail.
                disks[faulty[0]].set_faults(SimFaults {
                    offline: true,
                    ..SimFaults::default()
                });
            }
            if round == 4 {
                let (top, child) = pool.find_leaf(&name(faulty[0])).unwrap();
                assert_eq!(
                    top.children[child].state(),
                    LeafState::Faulted,
                    "seed {seed} {kind:?}"
                );
                assert_eq!(pool.health(), "DEGRADED");
                disks[faulty[0]].set_faults(SimFaults::default());
                pool.online_device(&name(faulty[0]), None).await.unwrap();
            }
            write_some(&pool, &mut written, &mut rng, 25).await;
            let expected = written.expected();
            for _ in 0..60 {
                let start = rng.below(VOLUME_BYTES / 16384) * 16384;
                let data =
                    ReadPiece::concat(pool.read(&volume, start, 16384).await.unwrap_or_else(
                        |error| panic!("seed {seed} {kind:?}: read at {start:#x}: {error}"),
                    ));
                assert!(
                    data == expected[start as usize..start as usize + 16384],
                    "seed {seed} {kind:?}: wrong data at {start:#x}"
                );
            }
        }
        for disk in &disks {
            disk.set_faults(SimFaults::default());
        }
        pool.resilver_wait().await;
        let resilver = pool.resilver_status();
        assert!(
            resilver.rewritten_blocks > 0 && resilver.errors == 0,
            "seed {seed} {kind:?}: {resilver:?}"
        );
        pool.store().repairs_quiesced().await;
        assert_intact(&pool, &written, &format!("seed {seed} {kind:?}")).await;
        // Writes stored corrupted stay corrupted until read: the scrub finds
        // and repairs them all, and the pool ends healthy.
        let first = scrub(&pool).await;
        assert_eq!(
            first.errors, 0,
            "seed {seed} {kind:?}: {:?}",
            first.error_details
        );
        let second = scrub(&pool).await;
        assert_eq!(
            (second.errors, second.bad_copies),
            (0, 0),
            "seed {seed} {kind:?}: {:?}",
            second.error_details
        );
        let report = pool.check_space().await.unwrap();
        assert!(
            report.problems.is_empty(),
            "seed {seed}: {:?}",
            report.problems
        );
        pool.export().await.unwrap();
    });
}

#[test]
fn seeded_faults_across_parity_levels_never_return_wrong_data() {
    let seeds: u64 = std::env::var("IRONPOOL_RAIDZ_SEEDS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(3);
    for seed in 1..=seeds {
        for (kind, width) in raidz_kinds() {
            faults_run(kind, width, seed * 7 + kind.parity() as u64);
        }
    }
}

#[test]
fn an_offline_device_gets_exactly_what_it_missed_when_it_returns() {
    for (kind, width) in [(TopVdevKind::Raidz2, 5), (TopVdevKind::Mirror, 2)] {
        let disks = devices(width, 40);
        let mut rng = Rng::new(40);
        let mut written = Written::default();
        Runtime::new_sim(40).block_on(async {
            let pool = new_pool(&disks, kind).await;
            write_some(&pool, &mut written, &mut rng, 150).await;
            pool.offline_device(&name(1)).await.unwrap();
            assert_eq!(pool.health(), "DEGRADED");
            let writes_while_away = disks[1].counters().writes;
            write_some(&pool, &mut written, &mut rng, 20).await;
            assert_eq!(
                disks[1].counters().writes,
                writes_while_away,
                "nothing goes to an offline device"
            );
            // Offline survives export and import.
            pool.export().await.unwrap();
            let pool = Pool::import_from_devices("tank", present(&disks, &[]), tunables())
                .await
                .unwrap();
            assert_eq!(pool.health(), "DEGRADED");
            let (top, child) = pool.find_leaf(&name(1)).unwrap();
            assert!(top.children[child].dtl.borrow().is_open());
            pool.online_device(&name(1), None).await.unwrap();
            pool.resilver_wait().await;
            let status = pool.resilver_status();
            assert_eq!(status.errors, 0, "{:?}", status.error_details);
            assert!(
                status.rewritten_blocks > 0,
                "the missed writes were resilvered"
            );
            let (size, free) = pool.space();
            assert!(
                status.rewritten_bytes * 2 < size - free,
                "{kind:?}: only what was missed is rewritten ({} of {} bytes)",
                status.rewritten_bytes,
                size - free
            );
            assert!(top.children[child].dtl.borrow().is_empty());
            assert_eq!(pool.health(), "ONLINE");
            pool.export().await.unwrap();
        });
        // The returned device now holds everything: lose the others it can spare.
        let gone: Vec<usize> = (0..width)
            .filter(|index| *index != 1)
            .take(TopVdevKind::redundancy(kind, width))
            .collect();
        Runtime::new_sim(41).block_on(async {
            let pool = Pool::import_from_devices("tank", present(&disks, &gone), tunables())
                .await
                .unwrap();
            assert_intact(
                &pool,
                &written,
                &format!("{kind:?} with only the resilvered device and enough others"),
            )
            .await;
            pool.export().await.unwrap();
        });
    }
}

/// Compares, for every block born before txg `born_before`, its part on child
/// `child` of vdev 0 (its column on RAID-Z, the whole block on a mirror) as
/// `old` and `new` hold it. Returns how many parts were compared.
async fn compare_parts(
    pool: &Rc<Pool>,
    old: &SimDevice,
    new: &SimDevice,
    child: usize,
    born_before: u64,
) -> usize {
    let top = pool.store().vdevs()[0].clone();
    let mut pointers = Vec::new();
    let table = pool.objects().dnode_table();
    let count = table.dnode().length_bytes / 512;
    let mut objects = vec![table.clone()];
    for id in 1..count {
        if let Ok(object) = pool.objects().open(id).await {
            objects.push(object);
        }
    }
    for object in &objects {
        pool.objects()
            .visit_pointers(object, &mut |_, _, pointer| pointers.push(*pointer))
            .await
            .unwrap();
    }
    let mut compared = 0;
    for pointer in pointers
        .iter()
        .filter(|pointer| pointer.birth_txg < born_before)
    {
        for dva in pointer.copies() {
            let length = top.io_bytes(pointer.physical_size as u64);
            let parts: Vec<(u64, usize)> = match top.raidz_geometry() {
                Some(geometry) => {
                    let map = geometry.map(dva.offset, length).unwrap();
                    map.columns
                        .iter()
                        .filter(|column| column.child as usize == child)
                        .map(|column| (column.child_offset_bytes, column.size_bytes as usize))
                        .collect()
                }
                None => vec![(dva.offset, length as usize)],
            };
            for (offset, bytes) in parts {
                let absolute = DATA_START_BYTES + offset;
                assert!(
                    old.peek(absolute, bytes) == new.peek(absolute, bytes),
                    "block born {} at {:?}: its part at {offset:#x} differs",
                    pointer.birth_txg,
                    dva
                );
                compared += 1;
            }
        }
    }
    compared
}

#[test]
fn a_replacement_ends_identical_to_the_device_it_replaced() {
    for (kind, width) in [
        (TopVdevKind::Raidz1, 4),
        (TopVdevKind::Raidz3, 6),
        (TopVdevKind::Mirror, 3),
    ] {
        let disks = devices(width, 50);
        let mut rng = Rng::new(50);
        let mut written = Written::default();
        let replacement = SimDevice::new("new", DEVICE_BYTES, 5050);
        Runtime::new_sim(50).block_on(async {
            let pool = new_pool(&disks, kind).await;
            write_some(&pool, &mut written, &mut rng, 150).await;
            pool.commit().await.unwrap();
            let replaced_at = pool.txg().open();
            pool.replace_device(
                &name(2),
                NewDevice {
                    path: "sim:new".into(),
                    device: replacement.clone() as Rc<dyn Device>,
                },
                false,
            )
            .await
            .unwrap();
            assert_eq!(pool.health(), "DEGRADED", "until resilvered");
            pool.resilver_wait().await;
            let status = pool.resilver_status();
            assert_eq!(status.errors, 0, "{:?}", status.error_details);
            assert_eq!(pool.health(), "ONLINE");
            // Every block the old device held: its part on the new device is
            // byte for byte the old device's.
            let compared = compare_parts(&pool, &disks[2], &replacement, 2, replaced_at).await;
            assert!(compared > 100, "{kind:?}: {compared} parts compared");
            let scrubbed = scrub(&pool).await;
            assert_eq!(
                (scrubbed.errors, scrubbed.bad_copies),
                (0, 0),
                "{:?}",
                scrubbed.error_details
            );
            pool.export().await.unwrap();
        });
        // The old device is no longer part of the pool; the new one carries it.
        let mut with_new: Vec<(String, Rc<dyn Device>)> = present(&disks, &[2]);
        with_new.push(("sim:new".into(), replacement.clone() as Rc<dyn Device>));
        let others_gone: Vec<String> = (0..width)
            .filter(|index| *index != 2)
            .take(TopVdevKind::redundancy(kind, width))
            .map(name)
            .collect();
        with_new.retain(|(path, _)| !others_gone.contains(path));
        Runtime::new_sim(51).block_on(async {
            let pool = Pool::import_from_devices("tank", with_new, tunables())
                .await
                .unwrap();
            assert_intact(&pool, &written, &format!("{kind:?} on the replacement")).await;
            pool.export().await.unwrap();
        });
    }
}

#[test]
fn writes_that_fail_on_a_device_in_service_are_resilvered_after_the_next_commit() {
    let disks = devices(4, 60);
    let mut rng = Rng::new(60);
    let mut written = Written::default();
    Runtime::new_sim(60).block_on(async {
        let pool = new_pool(&disks, TopVdevKind::Raidz1).await;
        write_some(&pool, &mut written, &mut rng, 40).await;
        // One write in five fails on d2: never 16 in a row, so it stays online.
        disks[2].set_faults(SimFaults {
            write_error_ppm: 200_000,
            ..SimFaults::default()
        });
        write_some(&pool, &mut written, &mut rng, 60).await;
        disks[2].set_faults(SimFaults::default());
        let (top, child) = pool.find_leaf(&name(2)).unwrap();
        assert!(top.children[child].is_online());
        assert!(top.children[child].queue.stats().write_errors > 0);
        assert!(
            !top.children[child].dtl.borrow().is_empty(),
            "the failed writes' txgs are logged"
        );
        assert_eq!(pool.health(), "DEGRADED");
        pool.commit().await.unwrap();
        pool.resilver_wait().await;
        let status = pool.resilver_status();
        assert_eq!(status.errors, 0, "{:?}", status.error_details);
        assert!(top.children[child].dtl.borrow().is_empty());
        assert_eq!(pool.health(), "ONLINE");
        pool.export().await.unwrap();
    });
    // d2 holds everything now: lose another device.
    Runtime::new_sim(61).block_on(async {
        let pool = Pool::import_from_devices("tank", present(&disks, &[0]), tunables())
            .await
            .unwrap();
        assert_intact(&pool, &written, "without d0 after the resilver of d2").await;
        pool.export().await.unwrap();
    });
}

/// A scrub rewrites the columns of a device that missed txgs (it reads every
/// block), so a clean, complete scrub also catches the device up: its log of
/// missed txgs empties and the next scrub finds nothing. Before, the log
/// stayed; every later scrub "repaired" the same columns again and reads
/// avoided the device for those txgs, so losing another device was fatal
/// (found by ironpool-sim, raidz2 and mirror, device damage).
#[test]
fn a_clean_scrub_catches_up_a_device_that_missed_writes() {
    let disks = devices(4, 62);
    let mut rng = Rng::new(62);
    let mut written = Written::default();
    Runtime::new_sim(62).block_on(async {
        let pool = new_pool(&disks, TopVdevKind::Raidz1).await;
        write_some(&pool, &mut written, &mut rng, 40).await;
        // Half of d2's writes fail, through the commits too, so the resilver
        // each commit starts fails and is not retried.
        disks[2].set_faults(SimFaults {
            write_error_ppm: 500_000,
            ..SimFaults::default()
        });
        write_some(&pool, &mut written, &mut rng, 60).await;
        pool.commit().await.unwrap();
        pool.resilver_wait().await;
        pool.commit().await.unwrap();
        pool.resilver_wait().await;
        disks[2].set_faults(SimFaults::default());
        let (top, child) = pool.find_leaf(&name(2)).unwrap();
        assert!(top.children[child].is_online());
        assert!(
            !top.children[child].dtl.borrow().is_empty(),
            "d2 should still be missing txgs before the scrub"
        );
        pool.scrub_start().unwrap();
        pool.scrub_wait().await;
        let first = pool.scrub_status();
        assert_eq!(first.errors, 0, "{:?}", first.error_details);
        assert!(first.bad_copies > 0 && first.repaired_copies == first.bad_copies);
        assert!(
            top.children[child].dtl.borrow().is_empty(),
            "a clean scrub leaves d2 caught up"
        );
        pool.scrub_start().unwrap();
        pool.scrub_wait().await;
        assert_eq!(
            pool.scrub_status().bad_copies,
            0,
            "{:?}",
            pool.scrub_status().error_details
        );
        pool.export().await.unwrap();
    });
    // d2 holds everything now: lose another device.
    Runtime::new_sim(63).block_on(async {
        let pool = Pool::import_from_devices("tank", present(&disks, &[0]), tunables())
            .await
            .unwrap();
        assert_intact(&pool, &written, "without d0 after the scrub caught d2 up").await;
        pool.export().await.unwrap();
    });
}
