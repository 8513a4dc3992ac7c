//! What the engine's simulator tests share: seeded simulated devices, their
//! names in a pool, a one-vdev layout, tunables for tests that commit when
//! they ask (and a mirror made with them), and seeded data.

#![allow(dead_code)]

use std::rc::Rc;
use std::time::Duration;

use ironpool::dev::sim::SimDevice;
use ironpool::dev::Device;
use ironpool::format::label::TopVdevKind;
use ironpool::pool::{NewDevice, NewTopVdev, PoolTunables};
use ironpool::rt::buf::{AlignedBuf, BufSlice};
use ironpool::rt::sim::Rng;

/// `count` devices of `size_bytes`, named `d0`, `d1`..., device `i` drawing
/// from seed `seed * 100 + i` (so a test's seed fixes every device).
pub fn devices(count: usize, size_bytes: u64, seed: u64) -> Vec<Rc<SimDevice>> {
    (0..count)
        .map(|index| SimDevice::new(&format!("d{index}"), size_bytes, seed * 100 + index as u64))
        .collect()
}

/// The power goes on every one of `disks` at once: each loses the writes it
/// took but did not flush, as `rng` draws (so a test's seed fixes the loss).
pub fn crash_all(disks: &[Rc<SimDevice>], rng: &mut Rng) {
    for disk in disks {
        disk.crash(rng);
    }
}

/// The devices as an import finds them: `sim:dN` and the device.
pub fn named(devices: &[Rc<SimDevice>]) -> Vec<(String, Rc<dyn Device>)> {
    devices
        .iter()
        .enumerate()
        .map(|(index, device)| (format!("sim:d{index}"), device.clone() as Rc<dyn Device>))
        .collect()
}

/// One top-level vdev of `kind` over all the devices.
pub fn layout(devices: &[Rc<SimDevice>], kind: TopVdevKind) -> Vec<NewTopVdev> {
    vec![NewTopVdev {
        log: false,
        kind,
        devices: named(devices)
            .into_iter()
            .map(|(path, device)| NewDevice { path, device })
            .collect(),
    }]
}

/// A long txg timeout: nothing is committed (or written out by a commit)
/// unless the test asks.
pub fn manual_commits() -> PoolTunables {
    PoolTunables {
        txg_timeout: Duration::from_secs(60),
        ..PoolTunables::default()
    }
}

/// A pool named "tank" of one mirror of `disks`, with `tunables`.
pub async fn mirror_with(
    disks: &[Rc<SimDevice>],
    tunables: PoolTunables,
) -> Rc<ironpool::pool::Pool> {
    ironpool::pool::Pool::create_on_devices(
        "tank",
        layout(disks, TopVdevKind::Mirror),
        false,
        tunables,
    )
    .await
    .unwrap()
}

/// A pool named "tank" of one mirror of `disks` that commits only when
/// asked ([`manual_commits`]).
pub async fn manual_mirror(disks: &[Rc<SimDevice>]) -> Rc<ironpool::pool::Pool> {
    mirror_with(disks, manual_commits()).await
}

/// `length` bytes drawn from a generator seeded by `tag`: distinct tags give
/// distinct blocks.
pub fn random_pattern(length: usize, tag: u64) -> BufSlice {
    let mut buffer = AlignedBuf::zeroed(length);
    Rng::new(tag.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1).fill(&mut buffer);
    BufSlice::whole(buffer.into_shared())
}

/// The pointer of `volume`'s block `blkid` and where its copy lies on each
/// side of a mirror: data blocks have one copy per side, the pointer's
/// first DVA, at the same device offset on each side.
pub async fn first_copy(
    pool: &ironpool::pool::Pool,
    volume: &ironpool::pool::volume::Volume,
    blkid: u64,
) -> (ironpool::format::BlockPointer, u64) {
    let pointer = pool
        .objects()
        .block_pointer(&volume.object, blkid)
        .await
        .unwrap();
    let offset = ironpool::format::DATA_START_BYTES + pointer.dvas[0].offset;
    (pointer, offset)
}

/// Damages the copy of `volume`'s block `blkid` on `disk` ([`first_copy`]).
pub async fn corrupt_block(
    pool: &ironpool::pool::Pool,
    volume: &ironpool::pool::volume::Volume,
    blkid: u64,
    disk: &SimDevice,
    rng: &mut Rng,
) {
    let (pointer, offset) = first_copy(pool, volume, blkid).await;
    disk.corrupt(offset, u64::from(pointer.dvas[0].asize), rng);
}
