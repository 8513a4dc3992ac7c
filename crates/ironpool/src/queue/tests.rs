//! Deterministic tests of the I/O queue on a simulated device.

use std::rc::Rc;
use std::time::Duration;

use super::*;
use crate::dev::sim::{SimDevice, SimLatency};
use crate::rt::Runtime;

fn setup(seed: u64) -> (Rc<SimDevice>, Rc<VdevQueue>) {
    let device = SimDevice::new("q", 64 << 20, seed);
    device.set_latency(SimLatency {
        minimum_us: 50,
        maximum_us: 50,
        spike_every: 0,
        spike_us: 0,
    });
    let queue = VdevQueue::new(
        Some(device.clone() as Rc<dyn Device>),
        QueueTunables::default(),
    );
    (device, queue)
}

fn pattern(length: usize, seed: u8) -> BufSlice {
    let mut buffer = AlignedBuf::zeroed(length);
    for (index, byte) in buffer.iter_mut().enumerate() {
        *byte = (index as u8).wrapping_mul(31).wrapping_add(seed);
    }
    BufSlice::whole(buffer.into_shared())
}

#[test]
fn adjacent_writes_of_different_classes_merge_into_one_device_io() {
    let runtime = Runtime::new_sim(1);
    runtime.block_on(async {
        let (device, queue) = setup(1);
        let first = queue.write(IoClass::SyncWrite, 0, pattern(4096, 1), IoFlags::default());
        let second = queue.write(
            IoClass::AsyncWrite,
            4096,
            pattern(4096, 2),
            IoFlags::default(),
        );
        let third = queue.write(IoClass::Scrub, 8192, pattern(8192, 3), IoFlags::default());
        let (a, b, c) = futures_util::future::join3(first, second, third).await;
        a.unwrap();
        b.unwrap();
        c.unwrap();
        assert_eq!(
            device.counters().writes,
            1,
            "three adjacent writes should be one device write"
        );
        let stats = queue.stats();
        assert_eq!(stats.write_ops, 1);
        assert_eq!(stats.write_requests, 3);
        assert_eq!(stats.write_bytes, 16384);
        assert_eq!(&device.peek(0, 4096)[..], &pattern(4096, 1)[..]);
        assert_eq!(&device.peek(4096, 4096)[..], &pattern(4096, 2)[..]);
        assert_eq!(&device.peek(8192, 8192)[..], &pattern(8192, 3)[..]);
    });
}

#[test]
fn merged_reads_hand_each_child_its_own_bytes_across_gaps() {
    let runtime = Runtime::new_sim(2);
    runtime.block_on(async {
        let (device, queue) = setup(2);
        queue
            .write(IoClass::SyncWrite, 0, pattern(65536, 9), IoFlags::default())
            .await
            .unwrap();
        let reads_before = device.counters().reads;
        // Two reads with an 8 KiB gap (under the 32 KiB read gap limit), one of a
        // different class.
        let first = queue.read(IoClass::SyncRead, 4096, 4096, IoFlags::default());
        let second = queue.read(IoClass::AsyncRead, 16384, 8192, IoFlags::default());
        let (a, b) = futures_util::future::join(first, second).await;
        let whole = pattern(65536, 9);
        assert_eq!(&a.unwrap()[..], &whole[4096..8192]);
        assert_eq!(&b.unwrap()[..], &whole[16384..24576]);
        assert_eq!(
            device.counters().reads - reads_before,
            1,
            "the two reads should be one device read"
        );
    });
}

#[test]
fn writes_with_a_gap_do_not_merge_and_repairs_stay_apart() {
    let runtime = Runtime::new_sim(3);
    runtime.block_on(async {
        let (device, queue) = setup(3);
        let first = queue.write(IoClass::SyncWrite, 0, pattern(4096, 1), IoFlags::default());
        let gap = queue.write(
            IoClass::SyncWrite,
            8192,
            pattern(4096, 2),
            IoFlags::default(),
        );
        let repair = queue.write(
            IoClass::SyncWrite,
            4096,
            pattern(4096, 3),
            IoFlags {
                repair: true,
                ..IoFlags::default()
            },
        );
        let (a, b, c) = futures_util::future::join3(first, gap, repair).await;
        a.unwrap();
        b.unwrap();
        c.unwrap();
        assert_eq!(device.counters().writes, 3);
    });
}

#[test]
fn optional_writes_join_past_the_limit_and_vanish_alone() {
    let runtime = Runtime::new_sim(4);
    runtime.block_on(async {
        let (device, queue) = setup(4);
        let tunables = QueueTunables {
            aggregation_limit_bytes: 8192,
            ..QueueTunables::default()
        };
        queue.set_tunables(tunables);
        // required 4K, optional 8K pad, required 4K: a 16K span, but only 8K of it
        // counts against the 8K limit, so all three go out as one write.
        let optional = IoFlags {
            optional: true,
            ..IoFlags::default()
        };
        let a = queue.write(IoClass::AsyncWrite, 0, pattern(4096, 1), IoFlags::default());
        let pad = queue.write(
            IoClass::AsyncWrite,
            4096,
            BufSlice::whole(AlignedBuf::zeroed(8192).into_shared()),
            optional,
        );
        let b = queue.write(
            IoClass::AsyncWrite,
            12288,
            pattern(4096, 2),
            IoFlags::default(),
        );
        let (a, pad, b) = futures_util::future::join3(a, pad, b).await;
        a.unwrap();
        pad.unwrap();
        b.unwrap();
        assert_eq!(
            device.counters().writes,
            1,
            "the pad should bridge the two required writes"
        );
        assert_eq!(queue.stats().write_bytes, 16384);
        let before = device.counters().writes;
        // A lone optional I/O is dropped: no device write at all.
        queue
            .write(
                IoClass::AsyncWrite,
                1 << 20,
                BufSlice::whole(AlignedBuf::zeroed(4096).into_shared()),
                optional,
            )
            .await
            .unwrap();
        assert_eq!(device.counters().writes, before);
        assert_eq!(queue.stats().optional_dropped, 1);
    });
}

#[test]
fn a_trailing_optional_write_is_not_written() {
    let runtime = Runtime::new_sim(5);
    runtime.block_on(async {
        let (device, queue) = setup(5);
        let optional = IoFlags {
            optional: true,
            ..IoFlags::default()
        };
        let a = queue.write(IoClass::AsyncWrite, 0, pattern(4096, 1), IoFlags::default());
        let pad = queue.write(
            IoClass::AsyncWrite,
            4096,
            BufSlice::whole(AlignedBuf::zeroed(4096).into_shared()),
            optional,
        );
        let (a, pad) = futures_util::future::join(a, pad).await;
        a.unwrap();
        pad.unwrap();
        assert_eq!(device.counters().writes, 1);
        assert_eq!(
            queue.stats().write_bytes,
            4096,
            "a trailing pad must not be written"
        );
        assert_eq!(queue.stats().optional_dropped, 1);
    });
}

/// The pad was queued first, so it heads the aggregate it is then trimmed
/// from (optional I/Os never end one): it must stay queued and complete, not
/// be lost with its writer waiting forever (a hang ironpool-sim found under
/// latency spikes on RAID-Z, whose skip sectors are optional pads).
#[test]
fn an_optional_head_trimmed_from_its_aggregate_still_completes() {
    let runtime = Runtime::new_sim(6);
    runtime.block_on(async {
        let (device, queue) = setup(6);
        let optional = IoFlags {
            optional: true,
            ..IoFlags::default()
        };
        let pad = queue.write(
            IoClass::AsyncWrite,
            4096,
            BufSlice::whole(AlignedBuf::zeroed(4096).into_shared()),
            optional,
        );
        let a = queue.write(IoClass::AsyncWrite, 0, pattern(4096, 1), IoFlags::default());
        let outcome = crate::rt::timeout(
            std::time::Duration::from_secs(60),
            futures_util::future::join(pad, a),
        )
        .await;
        let (pad, a) = outcome.expect("both writes complete");
        pad.unwrap();
        a.unwrap();
        assert_eq!(
            device.counters().writes,
            1,
            "only the required write reaches the device"
        );
        assert_eq!(queue.stats().optional_dropped, 1);
        assert_eq!(queue.stats().queued_total, 0);
    });
}

#[test]
fn class_choice_follows_min_then_max_active() {
    let tunables = QueueTunables::default();
    let mut state = State {
        next_id: 0,
        pending: Default::default(),
        fifo: Default::default(),
        queued: [0; CLASS_COUNT],
        by_offset: [BTreeSet::new(), BTreeSet::new(), BTreeSet::new()],
        active: [0; CLASS_COUNT],
        active_total: 0,
        round_robin_next: 0,
    };
    state.queued[IoClass::SyncRead as usize] = 5;
    state.queued[IoClass::Scrub as usize] = 5;
    // Both below their minimum: round robin picks sync read first, then scrub.
    assert_eq!(
        choose_class(&state, &tunables, 100),
        Some(IoClass::SyncRead)
    );
    state.round_robin_next = IoClass::SyncWrite as usize;
    // Scrub is background and sync reads are queued: scrub is held to its minimum (2).
    assert_eq!(choose_class(&state, &tunables, 100), Some(IoClass::Scrub));
    state.active[IoClass::Scrub as usize] = 2;
    assert_eq!(
        choose_class(&state, &tunables, 100),
        Some(IoClass::SyncRead)
    );
    // Sync read at its maximum and scrub at its held maximum: nothing to issue.
    state.active[IoClass::SyncRead as usize] = 256;
    assert_eq!(choose_class(&state, &tunables, 100), None);
    // With no interactive I/O queued or active, scrub may go up to its maximum.
    state.queued[IoClass::SyncRead as usize] = 0;
    state.active[IoClass::SyncRead as usize] = 0;
    assert_eq!(choose_class(&state, &tunables, 100), Some(IoClass::Scrub));
    state.active[IoClass::Scrub as usize] = 16;
    assert_eq!(choose_class(&state, &tunables, 100), None);
}

#[test]
fn async_writes_scale_with_dirty_data() {
    let tunables = QueueTunables::default();
    let limits = tunables.class_limits[IoClass::AsyncWrite as usize];
    assert_eq!(async_write_max(limits, 0, &tunables), limits.min_active);
    assert_eq!(async_write_max(limits, 30, &tunables), limits.min_active);
    assert_eq!(
        async_write_max(limits, 45, &tunables),
        (limits.min_active + limits.max_active) / 2
    );
    assert_eq!(async_write_max(limits, 60, &tunables), limits.max_active);
    assert_eq!(async_write_max(limits, 1000, &tunables), limits.max_active);
}

/// Queues a blocker, then a scrub read, an async write and a sync read, one
/// device slot; returns the order in which the three completed.
fn order_with(classes: bool) -> Vec<IoClass> {
    let runtime = Runtime::new_sim(7);
    runtime.block_on(async {
        let (_device, queue) = setup(7);
        let tunables = QueueTunables {
            classes,
            max_active_total: 1,
            ..QueueTunables::default()
        };
        queue.set_tunables(tunables);
        let blocker = {
            let queue = queue.clone();
            crate::rt::spawn(async move {
                queue
                    .write(
                        IoClass::SyncWrite,
                        8 << 20,
                        pattern(4096, 9),
                        IoFlags::default(),
                    )
                    .await
                    .unwrap()
            })
        };
        crate::rt::yield_now().await;
        crate::rt::yield_now().await;
        let order = Rc::new(std::cell::RefCell::new(Vec::new()));
        let mut tasks = Vec::new();
        for (index, class) in [IoClass::Scrub, IoClass::AsyncWrite, IoClass::SyncRead]
            .into_iter()
            .enumerate()
        {
            let queue = queue.clone();
            let order = order.clone();
            tasks.push(crate::rt::spawn(async move {
                if class == IoClass::AsyncWrite {
                    queue
                        .write(class, 1 << 20, pattern(4096, 1), IoFlags::default())
                        .await
                        .unwrap();
                } else {
                    queue
                        .read(class, index as u64 * 65536, 4096, IoFlags::default())
                        .await
                        .unwrap();
                }
                order.borrow_mut().push(class);
            }));
        }
        blocker.await;
        for task in tasks {
            task.await;
        }
        let order = order.borrow().clone();
        order
    })
}

#[test]
fn without_classes_the_oldest_io_goes_first() {
    assert_eq!(
        order_with(false),
        vec![IoClass::Scrub, IoClass::AsyncWrite, IoClass::SyncRead]
    );
    // With classes, the background scrub does not go first.
    assert_ne!(order_with(true)[0], IoClass::Scrub);
}

#[test]
fn a_sync_read_is_not_starved_by_a_flood_of_async_writes() {
    let runtime = Runtime::new_sim(6);
    runtime.block_on(async {
        let (_device, queue) = setup(6);
        let mut writes = Vec::new();
        // 2000 non-adjacent async writes (no aggregation help).
        for index in 0..2000u64 {
            let queue = queue.clone();
            writes.push(crate::rt::spawn(async move {
                queue
                    .write(
                        IoClass::AsyncWrite,
                        index * 8192,
                        pattern(4096, 1),
                        IoFlags::default(),
                    )
                    .await
            }));
        }
        crate::rt::sleep(Duration::from_micros(10)).await;
        let started = crate::rt::now();
        queue
            .read(IoClass::SyncRead, 4096, 4096, IoFlags::default())
            .await
            .unwrap();
        let read_latency = crate::rt::now().duration_since(started);
        let writes_started = crate::rt::now();
        for write in writes {
            write.await.unwrap();
        }
        let rest = crate::rt::now().duration_since(writes_started);
        // Each device I/O takes 50 us; async writes run at most 128 at a time, so
        // the read waits at most one round of them.
        assert!(
            read_latency <= Duration::from_micros(200),
            "sync read waited {read_latency:?}"
        );
        assert!(
            rest > read_latency * 4,
            "the writes should still have been running ({rest:?})"
        );
    });
}

#[test]
fn a_flush_reaches_the_device_only_when_a_write_completed_since_the_last() {
    let runtime = Runtime::new_sim(9);
    runtime.block_on(async {
        let (device, queue) = setup(9);
        // Nothing written: nothing to make durable.
        queue.flush().await.unwrap();
        assert_eq!(device.counters().flushes, 0);
        queue
            .write(IoClass::SyncWrite, 0, pattern(4096, 1), IoFlags::default())
            .await
            .unwrap();
        assert!(device.pending_bytes() > 0);
        queue.flush().await.unwrap();
        assert_eq!(device.counters().flushes, 1);
        assert_eq!(device.pending_bytes(), 0, "the write is durable");
        // Reads and a second flush with no write between: skipped.
        queue
            .read(IoClass::SyncRead, 0, 4096, IoFlags::default())
            .await
            .unwrap();
        queue.flush().await.unwrap();
        assert_eq!(device.counters().flushes, 1);
        let stats = queue.stats();
        assert_eq!((stats.flush_ops, stats.flushes_skipped), (1, 2));
        // A write that completes while a flush is in flight is not covered
        // by it: the next flush is sent.
        let write = queue.write(
            IoClass::SyncWrite,
            8192,
            pattern(4096, 2),
            IoFlags::default(),
        );
        let (written, flushed) = futures_util::future::join(write, queue.flush()).await;
        written.unwrap();
        flushed.unwrap();
        queue.flush().await.unwrap();
        assert_eq!(device.pending_bytes(), 0, "the second write is durable");
        // A device put in place gets its first flush.
        let before = device.counters().flushes;
        queue.set_device(Some(device.clone() as Rc<dyn Device>));
        queue.flush().await.unwrap();
        assert_eq!(device.counters().flushes, before + 1);
    });
}

#[test]
fn a_durable_write_survives_a_crash_without_a_flush_and_needs_none() {
    let runtime = Runtime::new_sim(10);
    runtime.block_on(async {
        let durable = IoFlags {
            durable: true,
            ..IoFlags::default()
        };
        for seed in 0..16u64 {
            let (device, queue) = setup(10 + seed);
            // An ordinary write left in the cache, then a durable one over
            // half of it and a durable one beside it (not merged with it).
            queue
                .write(IoClass::AsyncWrite, 0, pattern(8192, 1), IoFlags::default())
                .await
                .unwrap();
            let over = queue.write(IoClass::SyncWrite, 4096, pattern(4096, 2), durable);
            let beside = queue.write(
                IoClass::AsyncWrite,
                8192,
                pattern(4096, 3),
                IoFlags::default(),
            );
            let (over, beside) = futures_util::future::join(over, beside).await;
            over.unwrap();
            beside.unwrap();
            assert_eq!(
                device.counters().writes,
                3,
                "a durable write merged with another"
            );
            assert_eq!(queue.stats().durable_write_ops, 1);
            let mut rng = crate::rt::sim::Rng::new(seed);
            device.crash(&mut rng);
            // Whatever the crash kept of the older write, the durable bytes
            // are on the media.
            assert_eq!(&device.peek(4096, 4096)[..], &pattern(4096, 2)[..]);
        }
        // A flush after durable writes only has nothing to send.
        let (device, queue) = setup(40);
        queue
            .write(IoClass::SyncWrite, 0, pattern(4096, 4), durable)
            .await
            .unwrap();
        queue.flush().await.unwrap();
        assert_eq!(device.counters().flushes, 0);
        assert_eq!(device.pending_bytes(), 0);
        assert_eq!(queue.stats().flushes_skipped, 1);
    });
}
