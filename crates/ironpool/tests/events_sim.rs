//! Events and history on simulated devices: a device's bad reads, failed
//! reads, fault and return, a lost block and a scrub reach the event ring
//! with the device and range, within the rate limit (every error posted or
//! counted as suppressed); the commands that changed the pool stay in its
//! history across a crash and an import, bounded, oldest dropped but the
//! creation.

mod sim_support;

use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use ironpool::control::commands::{execute, Command};
use ironpool::dev::sim::SimFaults;
use ironpool::events::{Event, EventClass, DEVICE_EVENTS_PER_SECOND};
use ironpool::pool::history::HISTORY_BYTES_MAX;
use ironpool::pool::Pool;
use ironpool::rt::sim::Rng;
use ironpool::rt::Runtime;
use sim_support::{crash_all, devices, manual_commits, manual_mirror, named, random_pattern};

const DEVICE_BYTES: u64 = 256 << 20;
const VOLUME_BYTES: u64 = 8 << 20;
const BLOCK: u64 = 16384;

async fn fill(pool: &Rc<Pool>, name: &str) {
    let volume = pool.volume(name).unwrap();
    for blkid in 0..VOLUME_BYTES / BLOCK {
        pool.write(
            &volume,
            blkid * BLOCK,
            random_pattern(BLOCK as usize, blkid),
            false,
        )
        .await
        .unwrap();
    }
    pool.flush_all().await.unwrap();
}

/// Reads every block of `name`; returns how many reads failed.
async fn read_all(pool: &Rc<Pool>, name: &str) -> u64 {
    let volume = pool.volume(name).unwrap();
    let mut failed = 0;
    for blkid in 0..VOLUME_BYTES / BLOCK {
        if pool.read(&volume, blkid * BLOCK, BLOCK).await.is_err() {
            failed += 1;
        }
    }
    failed
}

fn all_events(pool: &Pool) -> Vec<Event> {
    pool.events().since(0, usize::MAX).events
}

fn of_class(events: &[Event], class: EventClass) -> Vec<&Event> {
    events.iter().filter(|event| event.class == class).collect()
}

/// Events of a device posted within one second of each other at most: the
/// rate limit.
fn assert_rate_limited(events: &[&Event]) {
    for (index, event) in events.iter().enumerate() {
        let within_a_second = events[index..]
            .iter()
            .take_while(|later| later.time_unix_ns < event.time_unix_ns + 1_000_000_000)
            .count();
        assert!(
            within_a_second <= 2 * DEVICE_EVENTS_PER_SECOND as usize,
            "{within_a_second} events of one device within a second"
        );
    }
}

#[test]
fn device_errors_state_changes_lost_blocks_and_scrubs_are_posted() {
    let disks = devices(2, DEVICE_BYTES, 31);
    Runtime::new_sim(31).block_on(async {
        let pool = manual_mirror(&disks).await;
        pool.create_volume("tank/v", VOLUME_BYTES, BLOCK as u32, BTreeMap::new())
            .await
            .unwrap();
        fill(&pool, "tank/v").await;
        let created = all_events(&pool);
        assert_eq!(created[0].class, EventClass::PoolCreate, "{created:?}");

        // Bad bytes from one side: every read still succeeds (the other
        // side has the block), each mismatch is posted or counted.
        disks[1].set_faults(SimFaults {
            read_corruption_ppm: 1_000_000,
            ..SimFaults::default()
        });
        assert_eq!(read_all(&pool, "tank/v").await, 0);
        pool.store().repairs_quiesced().await;
        let events = all_events(&pool);
        let checksum = of_class(&events, EventClass::ChecksumError);
        assert!(!checksum.is_empty(), "no checksum event: {events:?}");
        for event in &checksum {
            assert_eq!(event.device.as_deref(), Some("sim:d1"), "{event:?}");
            assert!(event.offset.is_some_and(|offset| offset > 0) && event.length == Some(BLOCK));
        }
        assert_rate_limited(&checksum);
        let counted = pool.store().vdevs()[0].children[1]
            .queue
            .stats()
            .checksum_errors;
        let batch = pool.events().since(0, usize::MAX);
        assert_eq!(
            checksum.len() as u64 + batch.suppressed,
            counted,
            "every checksum error is posted or counted as suppressed"
        );

        // The device vanishes: its failed I/Os are posted, and enough in a
        // row fault it, which the next commit reports as a state change.
        // (A second later: the rate limit is per device and second.)
        ironpool::rt::sleep(Duration::from_secs(1)).await;
        disks[1].set_offline(true);
        // The first pass left the blocks in the read cache: drop them, so
        // this pass reads the devices.
        pool.store().cache.clear();
        assert_eq!(read_all(&pool, "tank/v").await, 0);
        pool.store().repairs_quiesced().await;
        pool.commit().await.unwrap();
        let events = all_events(&pool);
        let io = of_class(&events, EventClass::IoError);
        assert!(
            io.iter()
                .all(|event| event.device.as_deref() == Some("sim:d1") && event.offset.is_some()),
            "{io:?}"
        );
        assert!(
            io.iter()
                .any(|event| event.detail.starts_with("read failed")),
            "{io:?}"
        );
        let states = of_class(&events, EventClass::DeviceState);
        assert!(
            states
                .iter()
                .any(|event| event.device.as_deref() == Some("sim:d1")
                    && event.detail == "ONLINE -> FAULTED"),
            "{states:?}"
        );

        // Back in service: a state change, and the resilver it starts.
        disks[1].set_offline(false);
        pool.clear().await.unwrap();
        pool.resilver_wait().await;
        let events = all_events(&pool);
        assert!(of_class(&events, EventClass::DeviceState)
            .iter()
            .any(|event| event.detail == "FAULTED -> ONLINE"));

        // A scrub: its start and end, with its figures.
        pool.scrub_start().unwrap();
        pool.scrub_wait().await;
        let events = all_events(&pool);
        assert_eq!(of_class(&events, EventClass::ScrubStart).len(), 1);
        let finish = of_class(&events, EventClass::ScrubFinish);
        assert_eq!(finish.len(), 1);
        assert!(finish[0].detail.starts_with("completed"), "{finish:?}");

        // Both sides bad: the block is lost, and said to be, by vdev and
        // address.
        for disk in &disks {
            disk.set_faults(SimFaults {
                read_corruption_ppm: 1_000_000,
                ..SimFaults::default()
            });
        }
        pool.store().cache.clear();
        assert!(read_all(&pool, "tank/v").await > 0);
        let events = all_events(&pool);
        let lost = of_class(&events, EventClass::DataError);
        assert!(!lost.is_empty());
        assert!(lost
            .iter()
            .all(|event| event.vdev == Some(0) && event.offset.is_some()));
        for disk in &disks {
            disk.set_faults(SimFaults::default());
        }
        // Numbers only grow.
        assert!(events.windows(2).all(|pair| pair[0].seq < pair[1].seq));
        pool.export().await.unwrap();
    });
}

#[test]
fn history_is_on_disk_when_a_command_returns_and_stays_bounded() {
    let disks = devices(2, DEVICE_BYTES, 41);
    let mut rng = Rng::new(41);
    Runtime::new_sim(41).block_on(async {
        let pool = manual_mirror(&disks).await;
        for command in [
            Command::VolumeCreate {
                name: "tank/db".into(),
                size_bytes: VOLUME_BYTES,
                properties: BTreeMap::from([("compression".into(), "lz4".into())]),
                sparse: false,
                parents: false,
                key: None,
            },
            Command::SetProperties {
                name: "tank/db".into(),
                properties: BTreeMap::from([("com.example:note".into(), "two words".into())]),
            },
            Command::Snapshot {
                names: vec!["tank/db@monday".into()],
                recursive: false,
            },
            // Only looks: not in the history.
            Command::Status,
        ] {
            execute(&pool, command, None).await.unwrap();
        }
        // A command that failed changed nothing: not in the history.
        assert!(execute(
            &pool,
            Command::VolumeDestroy {
                name: "tank/none".into(),
                recursive: false
            },
            None
        )
        .await
        .is_err());
        // No export: the devices lose whatever was not flushed.
        crash_all(&disks, &mut rng);
    });
    Runtime::new_sim(42).block_on(async {
        let pool = Pool::import_from_devices("tank", named(&disks), manual_commits())
            .await
            .unwrap();
        let commands: Vec<String> = pool
            .history()
            .into_iter()
            .map(|record| record.command)
            .collect();
        assert_eq!(
            commands,
            vec![
                "create tank mirror sim:d0 sim:d1".to_string(),
                format!("volume create tank/db {VOLUME_BYTES} -o compression=lz4"),
                "set 'com.example:note=two words' tank/db".to_string(),
                "snapshot tank/db@monday".to_string(),
            ]
        );
        // Far past the bound, committed in batches.
        for batch in 0..40u64 {
            for index in 0..250u64 {
                pool.log_history(format!("set org:batch={batch} tank/db # {index}"));
            }
            pool.commit_linked().await.unwrap();
        }
        pool.export().await.unwrap();
    });
    Runtime::new_sim(43).block_on(async {
        let pool = Pool::import_from_devices("tank", named(&disks), manual_commits())
            .await
            .unwrap();
        let history = pool.history();
        let bytes: usize = history
            .iter()
            .map(|record| 4 + serde_json::to_vec(record).unwrap().len())
            .sum();
        assert!(bytes <= HISTORY_BYTES_MAX, "{bytes} bytes of history");
        assert!(history.len() > 1000, "{} records", history.len());
        assert_eq!(history[0].command, "create tank mirror sim:d0 sim:d1");
        assert_eq!(
            history.last().unwrap().command,
            "set org:batch=39 tank/db # 249"
        );
        // The oldest went, the order stayed.
        assert!(history[1].command.starts_with("set org:batch="));
        assert!(history.windows(2).all(|pair| pair[0].txg <= pair[1].txg));
        let report = pool.check_space().await.unwrap();
        assert!(report.problems.is_empty(), "{:?}", report.problems);
        pool.export().await.unwrap();
    });
}

/// A history whose every copy is damaged does not keep the pool from
/// importing: the import says so, a new history starts with the next
/// command, and the pool's space stays consistent.
#[test]
fn an_unreadable_history_is_reported_and_started_over() {
    let disks = devices(2, DEVICE_BYTES, 51);
    let mut rng = Rng::new(51);
    let damaged = Runtime::new_sim(51).block_on(async {
        let pool = manual_mirror(&disks).await;
        execute(
            &pool,
            Command::VolumeCreate {
                name: "tank/v".into(),
                size_bytes: VOLUME_BYTES,
                properties: BTreeMap::new(),
                sparse: false,
                parents: false,
                key: None,
            },
            None,
        )
        .await
        .unwrap();
        let id = pool.directory().history_object;
        assert_ne!(id, 0);
        let object = pool.objects().open(id).await.unwrap();
        let pointer = pool.objects().block_pointer(&object, 0).await.unwrap();
        assert!(!pointer.is_hole());
        pool.export().await.unwrap();
        pointer
    });
    // Every copy on both sides of the mirror.
    for dva in damaged.copies() {
        for disk in &disks {
            disk.corrupt(
                ironpool::format::DATA_START_BYTES + dva.offset,
                u64::from(dva.asize),
                &mut rng,
            );
        }
    }
    Runtime::new_sim(52).block_on(async {
        let pool = Pool::import_from_devices("tank", named(&disks), manual_commits())
            .await
            .unwrap();
        let notes = pool.notes().join("; ");
        assert!(
            notes.contains("command history could not be read"),
            "{notes}"
        );
        assert!(pool.history().is_empty());
        execute(&pool, Command::ScrubStart, None).await.unwrap();
        pool.scrub_wait().await;
        let history = pool.history();
        assert_eq!(history.len(), 1);
        assert_eq!(history[0].command, "scrub tank");
        assert!(pool.volume("tank/v").is_ok());
        let report = pool.check_space().await.unwrap();
        assert!(report.problems.is_empty(), "{:?}", report.problems);
        pool.export().await.unwrap();
    });
    Runtime::new_sim(53).block_on(async {
        let pool = Pool::import_from_devices("tank", named(&disks), manual_commits())
            .await
            .unwrap();
        assert!(pool.notes().is_empty(), "{:?}", pool.notes());
        assert_eq!(pool.history().len(), 1);
        pool.export().await.unwrap();
    });
}
