//! The check that every uberblock import may choose is consistent.
//!
//! Import takes the newest valid uberblock and falls back to older ones (up to
//! `DEFER_TXGS` back, the txgs whose freed blocks are not yet reused) when the
//! newer trees do not load. After a crash, each of those candidates must be a
//! whole pool: on copies of the devices with every newer uberblock erased,
//! import must land exactly on it, the space walk must be clean, and every block
//! of every volume must read (content is not checked: an older txg legitimately
//! lacks later writes).

use std::rc::Rc;

use ironpool::alloc::DEFER_TXGS;
use ironpool::dev::sim::SimDevice;
use ironpool::dev::Device;
use ironpool::format::uberblock::{Uberblock, UBERBLOCK_BYTES};
use ironpool::format::{label_offset, LABEL_CONFIG_BYTES, LABEL_COUNT, UBERBLOCK_RING_BYTES};
use ironpool::pool::Pool;
use ironpool::rt::buf::{AlignedBuf, BufSlice};

use crate::run::{Sim, POOL};

/// Checks every older uberblock import may fall back to (the newest is checked
/// by the real import that follows).
pub(crate) async fn older_uberblocks(sim: &mut Sim) -> Result<(), String> {
    let present: Vec<usize> = (0..sim.devices().len())
        .filter(|device| sim.is_present(*device))
        .collect();
    // Only the txgs of the newest device configuration: an uberblock from
    // before a replacement names a different set of devices (its guid sum
    // differs), and rewinding across a configuration change is refused by
    // design, as in ZFS.
    let mut probes = Vec::new();
    for &device in &present {
        let path = format!("sim:d{device}");
        let probe = ironpool::pool::labels::probe_device(
            &*sim.devices()[device],
            std::path::Path::new(&path),
        )
        .await;
        if let Some(label) = probe.label.clone() {
            probes.push((label, probe.uberblocks));
        }
    }
    let newest = probes
        .iter()
        .map(|(label, _)| label)
        .max_by_key(|label| label.config.config_txg)
        .map(|label| (label.pool_guid, label.config.guid_sum()));
    let mut txgs: Vec<u64> = Vec::new();
    if let Some((pool_guid, guid_sum)) = newest {
        for (_, uberblocks) in &probes {
            txgs.extend(
                uberblocks
                    .iter()
                    .filter(|uberblock| {
                        uberblock.pool_guid == pool_guid && uberblock.guid_sum == guid_sum
                    })
                    .map(|uberblock| uberblock.txg),
            );
        }
    }
    txgs.sort_unstable_by(|a, b| b.cmp(a));
    txgs.dedup();
    for &txg in txgs.iter().take(1 + DEFER_TXGS as usize).skip(1) {
        check_at(sim, &present, txg).await.map_err(|problem| {
            format!(
                "import rewound to txg {txg} (newest {}): {problem}",
                txgs[0]
            )
        })?;
    }
    Ok(())
}

/// Imports copies of the present devices with every uberblock newer than `txg`
/// erased, and checks the pool found there.
async fn check_at(sim: &mut Sim, present: &[usize], txg: u64) -> Result<(), String> {
    let mut copies: Vec<(String, Rc<dyn Device>)> = Vec::new();
    for &device in present {
        let seed = sim.next_seed();
        let copy = sim.devices()[device].clone_media(&format!("rewind{device}"), seed);
        erase_newer_uberblocks(&copy, txg).await?;
        copies.push((format!("sim:d{device}"), copy as Rc<dyn Device>));
    }
    let pool = Pool::import_from_devices(POOL, copies, sim.tunables())
        .await
        .map_err(|error| format!("import failed: {error}"))?;
    crate::run::load_keys(&pool).await?;
    if pool.imported_txg() != txg {
        return Err(format!(
            "import chose txg {} instead ({:?})",
            pool.imported_txg(),
            pool.notes()
        ));
    }
    let report = pool
        .check_space()
        .await
        .map_err(|error| format!("space check: {error}"))?;
    if !report.problems.is_empty() {
        return Err(format!("space check: {}", report.problems.join("; ")));
    }
    let volumes: Vec<_> = pool
        .open_volumes()
        .into_iter()
        .map(|(_, volume)| volume)
        .collect();
    for volume in volumes {
        let size = volume.size_bytes.get();
        let step = 4 << 20;
        let mut offset = 0;
        while offset < size {
            let length = step.min(size - offset);
            pool.read(&volume, offset, length)
                .await
                .map_err(|error| format!("{} unreadable at {offset}: {error}", volume.name()))?;
            offset += length;
        }
    }
    pool.export()
        .await
        .map_err(|error| format!("export: {error}"))?;
    Ok(())
}

/// Zeroes every uberblock slot holding a txg newer than `txg`, in every label.
async fn erase_newer_uberblocks(device: &Rc<SimDevice>, txg: u64) -> Result<(), String> {
    let size = device.info().size_bytes;
    for index in 0..LABEL_COUNT {
        let ring_offset = label_offset(index, size) + LABEL_CONFIG_BYTES;
        let (result, mut buffers) = device
            .read(
                ring_offset,
                vec![AlignedBuf::zeroed(UBERBLOCK_RING_BYTES as usize)],
            )
            .await;
        result.map_err(|error| format!("reading the ring of label {index}: {error}"))?;
        let mut ring = buffers.pop().expect("one buffer");
        let mut changed = false;
        for slot in ring.chunks_mut(UBERBLOCK_BYTES) {
            if Uberblock::decode(slot).is_ok_and(|uberblock| uberblock.txg > txg) {
                slot.fill(0);
                changed = true;
            }
        }
        if changed {
            device
                .write(
                    ring_offset,
                    vec![BufSlice::whole(ring.into_shared())],
                    false,
                )
                .await
                .map_err(|error| format!("erasing uberblocks of label {index}: {error}"))?;
        }
    }
    device.flush_now();
    Ok(())
}
