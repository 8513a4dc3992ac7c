//! RAID-Z group I/O on simulated devices: placement on the children, degraded
//! writes, reconstruction of every combination of bad columns, scrub of
//! parity, repair, and pad sectors as optional I/Os.

use std::rc::Rc;

use super::*;
use crate::dev::sim::SimDevice;
use crate::dev::Device;
use crate::format::label::TopVdevKind;
use crate::queue::QueueTunables;
use crate::rt::sim::Rng;
use crate::rt::Runtime;
use crate::vdev::run::RunBlock;
use crate::vdev::LeafVdev;

const DEVICE_BYTES: u64 = 64 << 20;

fn group(parity: u32, children: usize, seed: u64) -> (Vec<Rc<SimDevice>>, TopVdev) {
    let devices: Vec<Rc<SimDevice>> = (0..children)
        .map(|index| SimDevice::new(&format!("c{index}"), DEVICE_BYTES, seed * 64 + index as u64))
        .collect();
    let leaves = devices
        .iter()
        .enumerate()
        .map(|(index, device)| {
            LeafVdev::new(
                100 + index as u64,
                format!("c{index}"),
                Some(device.clone() as Rc<dyn Device>),
                QueueTunables::default(),
            )
        })
        .collect();
    let kind = TopVdevKind::raidz(parity).expect("parity 1-3");
    let top = TopVdev::new(0, 1, kind, 12, 32 << 20, 24, leaves).expect("a valid group");
    (devices, top)
}

fn block(length: usize, tag: u64) -> BufSlice {
    let mut rng = Rng::new(tag);
    let mut buffer = AlignedBuf::zeroed(length);
    rng.fill(&mut buffer);
    BufSlice::whole(buffer.into_shared())
}

fn column_on_device(devices: &[Rc<SimDevice>], column: &super::super::Column) -> Vec<u8> {
    devices[column.child as usize].peek(
        DATA_START_BYTES + column.child_offset_bytes,
        column.size_bytes as usize,
    )
}

#[test]
fn every_shape_round_trips_with_columns_where_the_geometry_says() {
    let runtime = Runtime::new_sim(1);
    runtime.block_on(async {
        for parity in 1..=3u32 {
            for children in [parity as usize + 1, parity as usize + 3, 7] {
                let (devices, top) =
                    group(parity, children, u64::from(parity) * 10 + children as u64);
                let geometry = *top.raidz_geometry().unwrap();
                // Offsets in both halves of the RAID-Z1 parity swap period.
                let mut offset = 0;
                for (index, length) in [4096usize, 8192, 12288, 16384, 28672, 131072, 4096, 65536]
                    .into_iter()
                    .enumerate()
                {
                    if index == 4 {
                        offset = (1 << 20) + 8192;
                    }
                    let data = block(length, index as u64 + 7 * u64::from(parity));
                    let outcome = top
                        .write(
                            IoClass::AsyncWrite,
                            offset,
                            data.clone(),
                            IoFlags::default(),
                        )
                        .await
                        .unwrap();
                    assert!(outcome.missed_children.is_empty());
                    let map = geometry.map(offset, length as u64).unwrap();
                    for column in map.data_columns() {
                        let start = column.data_offset_bytes.unwrap() as usize;
                        assert_eq!(
                            column_on_device(&devices, column),
                            &data[start..start + column.size_bytes as usize],
                            "p{parity} w{children} {length} at {offset:#x}"
                        );
                    }
                    let read = top
                        .read_verified(
                            IoClass::SyncRead,
                            offset,
                            length as u64,
                            1,
                            &|bytes: &[u8]| bytes == &data[..],
                        )
                        .await
                        .unwrap();
                    assert_eq!(&read.data[..], &data[..]);
                    assert!(read.bad_children.is_empty());
                    offset += top.allocated_size(length as u64);
                }
                let reads: u64 = top
                    .children
                    .iter()
                    .map(|child| child.queue.stats().read_requests)
                    .sum();
                let data_columns: u64 = 8 * (children as u64 - u64::from(parity)).min(32);
                assert!(
                    reads <= data_columns,
                    "healthy reads touch data columns only ({reads} reads)"
                );
            }
        }
    });
}

/// Corrupts every column in `columns` of the block at `offset` on the devices.
fn corrupt_columns(devices: &[Rc<SimDevice>], map: &RaidzMap, columns: &[usize], rng: &mut Rng) {
    for &index in columns {
        let column = &map.columns[index];
        devices[column.child as usize].corrupt(
            DATA_START_BYTES + column.child_offset_bytes,
            column.size_bytes,
            rng,
        );
    }
}

#[test]
fn any_up_to_parity_bad_columns_are_found_rebuilt_and_repaired() {
    let runtime = Runtime::new_sim(2);
    runtime.block_on(async {
        let mut rng = Rng::new(2);
        for parity in 1..=3u32 {
            let (devices, top) = group(parity, 6, 20 + u64::from(parity));
            let geometry = *top.raidz_geometry().unwrap();
            let length = 40960u64;
            let map = geometry.map(0, length).unwrap();
            let count = map.columns.len();
            // Every combination of 1..=parity columns (6 columns: at most 41).
            let mut combinations: Vec<Vec<usize>> = Vec::new();
            for size in 1..=parity as usize {
                let mut chosen: Vec<usize> = (0..size).collect();
                loop {
                    combinations.push(chosen.clone());
                    if !next_combination(&mut chosen, count) {
                        break;
                    }
                }
            }
            for (round, bad) in combinations.iter().enumerate() {
                let data = block(length as usize, round as u64 + 100 * u64::from(parity));
                top.write(IoClass::AsyncWrite, 0, data.clone(), IoFlags::default())
                    .await
                    .unwrap();
                corrupt_columns(&devices, &map, bad, &mut rng);
                let errors_before: Vec<u64> = top
                    .children
                    .iter()
                    .map(|child| child.queue.stats().checksum_errors)
                    .collect();
                let verify = |bytes: &[u8]| bytes == &data[..];
                let read = top
                    .read_verified(IoClass::SyncRead, 0, length, 1, &verify)
                    .await
                    .unwrap();
                assert_eq!(&read.data[..], &data[..], "p{parity} bad {bad:?}");
                let mut expected: Vec<usize> = bad
                    .iter()
                    .map(|index| map.columns[*index].child as usize)
                    .collect();
                expected.sort_unstable();
                let mut reported = read.bad_children.clone();
                reported.sort_unstable();
                // A read that never needed the parity cannot know bad parity.
                let bad_data = bad.iter().any(|index| *index >= map.data_columns_first);
                if bad_data {
                    assert_eq!(reported, expected, "p{parity} bad {bad:?}");
                    for child in &expected {
                        assert!(
                            top.children[*child].queue.stats().checksum_errors
                                > errors_before[*child],
                            "checksum error counted on child {child}"
                        );
                    }
                } else {
                    assert!(reported.is_empty());
                }
                // The scrub sees everything, parity included, and the repair fixes it.
                let (scrubbed, scrub_bad) = top.scrub_read(0, length, 1, &verify).await;
                assert_eq!(&scrubbed.unwrap()[..], &data[..]);
                let mut scrub_bad_sorted = scrub_bad.clone();
                scrub_bad_sorted.sort_unstable();
                assert_eq!(scrub_bad_sorted, expected, "scrub of p{parity} bad {bad:?}");
                top.repair(&scrub_bad, 0, data.clone(), IoClass::Scrub)
                    .await
                    .unwrap();
                let (_, after) = top.scrub_read(0, length, 1, &verify).await;
                assert!(
                    after.is_empty(),
                    "p{parity} bad {bad:?}: still bad after repair: {after:?}"
                );
            }
        }
    });
}

#[test]
fn more_bad_columns_than_parity_fail_and_never_return_wrong_data() {
    let runtime = Runtime::new_sim(3);
    runtime.block_on(async {
        let mut rng = Rng::new(3);
        for parity in 1..=3u32 {
            let (devices, top) = group(parity, 7, 30 + u64::from(parity));
            let geometry = *top.raidz_geometry().unwrap();
            let length = 65536u64;
            let map = geometry.map(0, length).unwrap();
            let data = block(length as usize, 3 + u64::from(parity));
            top.write(IoClass::AsyncWrite, 0, data.clone(), IoFlags::default())
                .await
                .unwrap();
            let bad: Vec<usize> =
                (map.data_columns_first..map.data_columns_first + parity as usize + 1).collect();
            corrupt_columns(&devices, &map, &bad, &mut rng);
            let verify = |bytes: &[u8]| bytes == &data[..];
            assert!(top
                .read_verified(IoClass::SyncRead, 0, length, 1, &verify)
                .await
                .is_err());
            let (scrubbed, _) = top.scrub_read(0, length, 1, &verify).await;
            assert!(scrubbed.is_none());
        }
    });
}

#[test]
fn children_away_are_skipped_reported_and_rebuilt_from_parity() {
    let runtime = Runtime::new_sim(4);
    runtime.block_on(async {
        for parity in 1..=3u32 {
            let (_devices, top) = group(parity, 6, 40 + u64::from(parity));
            for child in 0..parity as usize {
                top.children[child].set_offline();
            }
            assert!(top.is_available());
            let length = 24576u64;
            let data = block(length as usize, 4 + u64::from(parity));
            let outcome = top
                .write(IoClass::AsyncWrite, 0, data.clone(), IoFlags::default())
                .await
                .unwrap();
            let mut missed = outcome.missed_children.clone();
            missed.sort_unstable();
            assert_eq!(missed, (0..parity as usize).collect::<Vec<_>>());
            let read = top
                .read_verified(IoClass::SyncRead, 0, length, 1, &|bytes: &[u8]| {
                    bytes == &data[..]
                })
                .await
                .unwrap();
            assert_eq!(&read.data[..], &data[..]);
            assert!(
                read.bad_children.is_empty(),
                "children away are not repaired by reads"
            );
            // One more away: the group can no longer hold a block.
            top.children[parity as usize].set_offline();
            assert!(!top.is_available());
            let error = top
                .write(
                    IoClass::AsyncWrite,
                    1 << 20,
                    data.clone(),
                    IoFlags::default(),
                )
                .await
                .unwrap_err();
            assert!(matches!(error, VdevError::TooManyFailures(_)), "{error}");
        }
    });
}

#[test]
fn children_that_missed_the_txg_are_not_trusted_and_scrub_rewrites_them() {
    let runtime = Runtime::new_sim(5);
    runtime.block_on(async {
        let mut rng = Rng::new(5);
        let (devices, top) = group(2, 6, 50);
        let geometry = *top.raidz_geometry().unwrap();
        let length = 16384u64;
        let map = geometry.map(0, length).unwrap();
        let data = block(length as usize, 5);
        top.write(IoClass::AsyncWrite, 0, data.clone(), IoFlags::default())
            .await
            .unwrap();
        // The child of the first data column "missed" txg 9: its bytes are stale.
        let stale_column = map.data_columns_first;
        let stale_child = map.columns[stale_column].child as usize;
        corrupt_columns(&devices, &map, &[stale_column], &mut rng);
        top.children[stale_child].dtl.borrow_mut().add(9);
        let verify = |bytes: &[u8]| bytes == &data[..];
        let read = top
            .read_verified(IoClass::SyncRead, 0, length, 9, &verify)
            .await
            .unwrap();
        assert_eq!(&read.data[..], &data[..]);
        assert!(read.bad_children.is_empty());
        assert_eq!(
            top.children[stale_child].queue.stats().checksum_errors,
            0,
            "a stale child is not blamed"
        );
        let (_, bad) = top.scrub_read(0, length, 9, &verify).await;
        assert_eq!(bad, vec![stale_child]);
        top.repair(&bad, 0, data.clone(), IoClass::Rebuild)
            .await
            .unwrap();
        assert_eq!(
            column_on_device(&devices, &map.columns[stale_column]),
            &data[..map.columns[stale_column].size_bytes as usize]
        );
        // Blocks of other txgs are read from it as usual.
        let read = top
            .read_verified(IoClass::SyncRead, 0, length, 8, &verify)
            .await
            .unwrap();
        assert!(read.bad_children.is_empty());
    });
}

#[test]
fn a_pad_on_an_untouched_child_is_an_optional_write_merged_into_a_gap_or_dropped() {
    let runtime = Runtime::new_sim(6);
    runtime.block_on(async {
        // The documentation's example: raidz2 of 6, a 12 KiB block at 8 MiB +
        // 12 KiB writes five one-sector columns and pads child 4 at 0x156000.
        let (devices, top) = group(2, 6, 60);
        let offset = (8 << 20) + 12288;
        let map = top.raidz_geometry().unwrap().map(offset, 12288).unwrap();
        assert_eq!(map.skip_sectors.len(), 1);
        let skip = map.skip_sectors[0];
        assert_eq!(
            (skip.child, skip.child_offset_bytes, skip.write),
            (4, 0x156000, super::super::SkipWrite::Optional)
        );
        let pad_queue = &top.children[4].queue;
        // Alone, the pad is dropped: no write reaches child 4.
        top.write(
            IoClass::AsyncWrite,
            offset,
            block(12288, 61),
            IoFlags::default(),
        )
        .await
        .unwrap();
        assert_eq!(pad_queue.stats().optional_dropped, 1);
        assert_eq!(devices[4].counters().writes, 0);
        // Between two writes of its child, it fills the gap: one device write.
        let before = pad_queue.stats().write_ops;
        let absolute = DATA_START_BYTES + skip.child_offset_bytes;
        let left = pad_queue.write(
            IoClass::AsyncWrite,
            absolute - 4096,
            block(4096, 62),
            IoFlags::default(),
        );
        let right = pad_queue.write(
            IoClass::AsyncWrite,
            absolute + 4096,
            block(4096, 63),
            IoFlags::default(),
        );
        let middle = top.write(
            IoClass::AsyncWrite,
            offset,
            block(12288, 64),
            IoFlags::default(),
        );
        let (a, b, c) = futures_util::future::join3(left, right, middle).await;
        a.unwrap();
        b.unwrap();
        c.unwrap();
        let stats = pad_queue.stats();
        assert_eq!(
            stats.write_ops - before,
            1,
            "the two writes and the pad between them go out as one"
        );
        assert_eq!(stats.optional_dropped, 1);
    });
}

#[test]
fn combinations_step_in_order() {
    let mut chosen = vec![0, 1];
    let mut seen = vec![chosen.clone()];
    while next_combination(&mut chosen, 4) {
        seen.push(chosen.clone());
    }
    assert_eq!(
        seen,
        vec![
            vec![0, 1],
            vec![0, 2],
            vec![0, 3],
            vec![1, 2],
            vec![1, 3],
            vec![2, 3]
        ]
    );
    assert!(!next_combination(&mut [], 3));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 500, ..proptest::prelude::ProptestConfig::default() })]

    /// Parity computed before a block has a place is the parity of the block
    /// at any offset, for every width, parity, ashift and size (write-back
    /// relies on it: it computes parity when it holds a block).
    #[test]
    fn parity_computed_ahead_is_the_parity_at_any_offset(
        parity in 1..=3u32,
        extra_children in 0..=20u32,
        ashift in 9..=13u8,
        sectors in 1..=48u64,
        offset_sectors in 0..(1u64 << 22),
        tag in 0..u64::MAX,
    ) {
        let geometry = RaidzGeometry::new(parity + 1 + extra_children, parity, ashift).unwrap();
        let data = block((sectors << ashift) as usize, tag);
        let ahead = PrecomputedParity::compute(&geometry, &data).expect("whole sectors have parity ahead");
        let offset = offset_sectors << ashift;
        let map = geometry.map(offset, data.len() as u64).unwrap();
        let expected = compute_parity(&map, &data);
        proptest::prop_assert!(ahead.fits(&geometry, data.len()));
        proptest::prop_assert_eq!(PrecomputedParity::bytes_for(&geometry, data.len() as u64), ahead.bytes());
        proptest::prop_assert_eq!(ahead.columns.len(), expected.len());
        for (column, (got, want)) in ahead.columns.iter().zip(&expected).enumerate() {
            proptest::prop_assert!(got[..] == want[..], "parity column {} differs at offset {:#x}", column, offset);
        }
    }
}

#[test]
fn parity_ahead_is_used_only_for_its_geometry_and_size_and_lands_on_the_devices() {
    let runtime = Runtime::new_sim(1);
    runtime.block_on(async {
        for parity in 1..=3u32 {
            let (devices, top) = group(parity, parity as usize + 4, 90 + u64::from(parity));
            let geometry = *top.raidz_geometry().unwrap();
            let other =
                RaidzGeometry::new(geometry.children() + 1, parity, geometry.ashift()).unwrap();
            // Several rows, so that another width splits the block differently.
            let data = block(65536, 40 + u64::from(parity));
            let smaller = block(32768, 50 + u64::from(parity));
            let own = PrecomputedParity::compute(&geometry, &data).unwrap();
            for wrong in [
                PrecomputedParity::compute(&other, &data).unwrap(),
                PrecomputedParity::compute(&geometry, &smaller).unwrap(),
            ] {
                assert!(
                    wrong
                        .columns
                        .iter()
                        .zip(&own.columns)
                        .any(|(a, b)| a[..] != b[..]),
                    "the wrong parity must differ for this test to mean anything"
                );
            }
            let run = [
                // Its own geometry and size, in both halves of the RAID-Z1 swap period.
                RunBlock {
                    offset: 0,
                    data: data.clone(),
                    parity: PrecomputedParity::compute(&geometry, &data).map(Rc::new),
                },
                RunBlock {
                    offset: (1 << 20) + 8192,
                    data: data.clone(),
                    parity: PrecomputedParity::compute(&geometry, &data).map(Rc::new),
                },
                // Another geometry's parity, and parity of other bytes of another size: both ignored.
                RunBlock {
                    offset: 2 << 20,
                    data: data.clone(),
                    parity: PrecomputedParity::compute(&other, &data).map(Rc::new),
                },
                RunBlock {
                    offset: 3 << 20,
                    data: data.clone(),
                    parity: PrecomputedParity::compute(&geometry, &smaller).map(Rc::new),
                },
            ];
            for outcome in top
                .write_run(IoClass::AsyncWrite, &run, IoFlags::default())
                .await
            {
                assert!(outcome.unwrap().missed_children.is_empty());
            }
            for written in &run {
                let map = geometry.map(written.offset, data.len() as u64).unwrap();
                let expected = compute_parity(&map, &data);
                for (index, column) in map.parity_columns().iter().enumerate() {
                    assert_eq!(
                        column_on_device(&devices, column),
                        &expected[index][..],
                        "p{parity} parity column {index} at {:#x}",
                        written.offset
                    );
                }
                let (read, bad) = top
                    .scrub_read(written.offset, data.len() as u64, 1, &|bytes: &[u8]| {
                        bytes == &data[..]
                    })
                    .await;
                assert_eq!(&read.expect("the block reads")[..], &data[..]);
                assert!(bad.is_empty(), "scrub finds parity bad on children {bad:?}");
            }
        }
    });
}
