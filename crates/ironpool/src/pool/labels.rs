//! Reading and writing labels and uberblocks, and finding a pool's devices.

use std::path::{Path, PathBuf};
use std::rc::Rc;

use crate::dev::file::FileDevice;
use crate::dev::Device;
use crate::format::label::Label;
use crate::format::uberblock::{Uberblock, UBERBLOCK_BYTES};
use crate::format::{
    label_offset, uberblock_slot_bytes, uberblock_slot_count, LABEL_CONFIG_BYTES, LABEL_COUNT,
    LABEL_SIZE_BYTES,
};
use crate::queue::{IoClass, IoFlags};
use crate::rt::buf::{AlignedBuf, BufSlice};
use crate::vdev::LeafVdev;

/// What one device says about itself.
pub struct Probe {
    pub path: PathBuf,
    pub size_bytes: u64,
    /// The newest valid label (highest config txg).
    pub label: Option<Label>,
    /// Valid labels with older configs than `label` (a commit that changed
    /// the config was cut short between writing the front and the back
    /// labels): import falls back to them when no uberblock matches the
    /// newest config.
    pub older_labels: Vec<Label>,
    /// Valid uberblocks found in all its labels.
    pub uberblocks: Vec<Uberblock>,
    /// Labels that did not decode, and why (a corrupted label is reported, and the
    /// device is still usable through its other labels).
    pub damaged_labels: Vec<(usize, String)>,
}

/// Reads one label (config area and ring) from a device.
async fn read_label(device: &dyn Device, offset: u64) -> Option<AlignedBuf> {
    if offset + LABEL_SIZE_BYTES > device.info().size_bytes {
        return None;
    }
    let (result, mut buffers) = device
        .read(
            offset,
            vec![AlignedBuf::for_overwrite(LABEL_SIZE_BYTES as usize)],
        )
        .await;
    result.ok()?;
    buffers.pop()
}

/// Decodes the valid uberblocks of a ring (slots of at least 1 KiB; parsing at
/// 1 KiB strides finds them whatever the sector size).
fn ring_uberblocks(ring: &[u8], out: &mut Vec<Uberblock>) {
    for slot in ring.chunks_exact(UBERBLOCK_BYTES) {
        if let Ok(uberblock) = Uberblock::decode(slot) {
            out.push(uberblock);
        }
    }
}

/// Reads every label of an (unlocked) device.
pub async fn probe_device(device: &dyn Device, path: &Path) -> Probe {
    let size = device.info().size_bytes;
    let mut probe = Probe {
        path: path.to_path_buf(),
        size_bytes: size,
        label: None,
        older_labels: Vec::new(),
        uberblocks: Vec::new(),
        damaged_labels: Vec::new(),
    };
    let mut offsets: Vec<(usize, u64)> =
        vec![(0, label_offset(0, size)), (1, label_offset(1, size))];
    let mut buffers = Vec::new();
    for (index, offset) in offsets.clone() {
        if let Some(buffer) = read_label(device, offset).await {
            buffers.push((index, buffer));
        }
    }
    // The end labels sit where the device ended when it joined the pool.
    let recorded_size = buffers.iter().find_map(|(_, buffer)| {
        let label = Label::decode(&buffer[..LABEL_CONFIG_BYTES as usize]).ok()?;
        label.config.device_size_of(label.leaf_guid)
    });
    let end_size = recorded_size.unwrap_or(size);
    offsets = vec![
        (2, label_offset(2, end_size)),
        (3, label_offset(3, end_size)),
    ];
    for (index, offset) in offsets {
        if let Some(buffer) = read_label(device, offset).await {
            buffers.push((index, buffer));
        }
    }
    for (index, buffer) in buffers {
        match Label::decode(&buffer[..LABEL_CONFIG_BYTES as usize]) {
            Ok(label) => {
                if probe
                    .label
                    .as_ref()
                    .is_none_or(|best| label.config_txg > best.config_txg)
                {
                    if let Some(previous) = probe.label.replace(label) {
                        probe.older_labels.push(previous);
                    }
                } else if probe
                    .label
                    .as_ref()
                    .is_some_and(|best| label.config_txg < best.config_txg)
                {
                    probe.older_labels.push(label);
                }
            }
            Err(crate::format::FormatError::BadMagic(_)) => {}
            Err(error) => probe.damaged_labels.push((index, error.to_string())),
        }
        ring_uberblocks(
            &buffer[LABEL_CONFIG_BYTES as usize..],
            &mut probe.uberblocks,
        );
    }
    probe
}

/// Probes every regular file and block device directly in `directory`.
pub async fn probe_directory(directory: &Path) -> std::io::Result<Vec<Probe>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(directory)?
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.path())
        .filter(|path| {
            std::fs::metadata(path)
                .map(|metadata| {
                    metadata.is_file()
                        || std::os::unix::fs::FileTypeExt::is_block_device(&metadata.file_type())
                })
                .unwrap_or(false)
        })
        .collect();
    paths.sort();
    let mut probes = Vec::new();
    for path in paths {
        if let Some(probe) = probe_path(&path).await {
            probes.push(probe);
        }
    }
    Ok(probes)
}

/// Probes one path (None if it cannot be opened or is too small to hold labels).
pub async fn probe_path(path: &Path) -> Option<Probe> {
    let device = FileDevice::open_for_probe(path).ok()?;
    if device.info().size_bytes < 2 * LABEL_SIZE_BYTES {
        return None;
    }
    Some(probe_device(&device, path).await)
}

/// The pool guids the labels of `probes` name, each once, in order.
pub fn pool_guids<'a>(probes: impl Iterator<Item = &'a Probe>) -> Vec<u64> {
    let mut guids: Vec<u64> = probes
        .filter_map(|probe| probe.label.as_ref().map(|label| label.pool_guid))
        .collect();
    guids.sort_unstable();
    guids.dedup();
    guids
}

/// A pool found on devices, as `ironpool import` lists it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct FoundPool {
    pub name: String,
    /// Hexadecimal: what `import GUID` takes.
    pub guid: String,
    /// False when its labels say it is in use (imported by a server that
    /// has not exported it: one running now, or one that crashed).
    pub exported_cleanly: bool,
    /// The host that last imported it.
    pub hostname: String,
    /// The newest txg found on its devices.
    pub txg: u64,
    /// Top-level vdevs: `mirror(2)`, `raidz2(6)`, `disk`.
    pub layout: Vec<String>,
    /// Its devices found, and how many its config names.
    pub devices: Vec<String>,
    pub expected_devices: usize,
    /// Every top-level vdev has enough devices to be read.
    pub importable: bool,
    /// Labels that did not decode on its devices (the others were used).
    pub damaged_labels: usize,
}

/// The pools whose devices are in `directories` (each probed read-only,
/// without locks), by guid: two pools of one name are two entries.
pub async fn discover(directories: &[PathBuf]) -> Vec<FoundPool> {
    let mut probes: Vec<Probe> = Vec::new();
    for directory in directories {
        // A directory that cannot be read holds no pool we can import.
        if let Ok(found) = probe_directory(directory).await {
            probes.extend(found);
        }
    }
    let mut pools = Vec::new();
    for guid in pool_guids(probes.iter()) {
        let mine: Vec<&Probe> = probes
            .iter()
            .filter(|probe| {
                probe
                    .label
                    .as_ref()
                    .is_some_and(|label| label.pool_guid == guid)
            })
            .collect();
        let Some(config) = mine
            .iter()
            .filter_map(|probe| probe.label.as_ref())
            .max_by_key(|label| label.config_txg)
            .map(|label| label.config.clone())
        else {
            continue;
        };
        let present: Vec<u64> = mine
            .iter()
            .filter_map(|probe| probe.label.as_ref().map(|label| label.leaf_guid))
            .collect();
        // A log device missing does not stop an import (see `Pool::import`).
        let importable = config.vdevs.iter().filter(|top| !top.log).all(|top| {
            let missing = top
                .children
                .iter()
                .filter(|leaf| !present.contains(&leaf.guid))
                .count();
            let tolerated = match top.kind {
                crate::format::label::TopVdevKind::Mirror => top.children.len() - 1,
                kind => kind.parity() as usize,
            };
            missing <= tolerated
        });
        let layout = config
            .vdevs
            .iter()
            .map(|top| {
                let shape = match top.kind {
                    crate::format::label::TopVdevKind::Disk => "disk".to_string(),
                    kind => format!(
                        "{}({})",
                        kind.vdev_name(0).trim_end_matches("-0"),
                        top.children.len()
                    ),
                };
                if top.log {
                    format!("log:{shape}")
                } else {
                    shape
                }
            })
            .collect();
        pools.push(FoundPool {
            name: config.name.clone(),
            guid: format!("{guid:#x}"),
            exported_cleanly: config.state == crate::format::label::PoolState::Exported,
            hostname: config.hostname.clone(),
            txg: mine
                .iter()
                .flat_map(|probe| probe.uberblocks.iter())
                .filter(|uberblock| uberblock.pool_guid == guid)
                .map(|uberblock| uberblock.txg)
                .max()
                .unwrap_or(0),
            layout,
            devices: mine
                .iter()
                .map(|probe| probe.path.display().to_string())
                .collect(),
            expected_devices: config
                .vdevs
                .iter()
                .map(|top| top.children.len())
                .sum::<usize>()
                + config
                    .spares
                    .iter()
                    .filter(|spare| spare.replacing.is_none())
                    .count(),
            importable,
            damaged_labels: mine.iter().map(|probe| probe.damaged_labels.len()).sum(),
        });
    }
    pools
}

/// Refuses `new` when it carries a label of some pool, unless `force`:
/// what every command that puts a device into a pool checks first
/// (`create`, `add`, `replace`, `attach`, spares).
pub async fn check_unlabelled(
    new: &crate::pool::NewDevice,
    force: bool,
) -> Result<(), crate::pool::PoolError> {
    let probe = probe_device(&*new.device, Path::new(&new.path)).await;
    match probe.label {
        Some(label) if !force => Err(crate::pool::PoolError::DeviceInUseByPool {
            path: new.path.clone(),
            pool: label.config.name,
            guid: label.pool_guid,
        }),
        _ => Ok(()),
    }
}

/// Erases the labels of `leaf`, a device that has just left pool `pool`
/// (`how`: "detached", "removed"), so that it no longer imports as part
/// of it and makes a new pool without `-f`. The pool's change is
/// committed already, so a failure is only told on stderr: the pool's
/// guid sum no longer counts the device either way.
pub async fn clear_leaf_labels(pool: &str, leaf: &LeafVdev, how: &str) {
    let Some(device) = leaf.device() else {
        return;
    };
    if let Err(error) = clear_labels(&*device).await {
        eprintln!(
            "ironpool: {pool}: clearing the labels of {how} {}: {error}",
            leaf.path.borrow()
        );
    }
}

/// Erases every label of a device (config areas and uberblock rings, at
/// the front and at the end) and flushes: it no longer belongs to any pool.
/// The caller has checked that no pool uses it.
pub async fn clear_labels(device: &dyn Device) -> Result<(), crate::dev::DeviceError> {
    let size = device.info().size_bytes;
    // The end labels sit where the device ended when it joined its pool
    // (it may have grown since), and where it ends now.
    let probe = probe_device(device, Path::new(&device.info().path)).await;
    let recorded = probe
        .label
        .as_ref()
        .and_then(|label| label.config.device_size_of(label.leaf_guid));
    let mut offsets: Vec<u64> = Vec::new();
    for end in [Some(size), recorded].into_iter().flatten() {
        for index in 0..LABEL_COUNT {
            offsets.push(label_offset(index, end.min(size)));
        }
    }
    offsets.sort_unstable();
    offsets.dedup();
    for offset in offsets {
        if offset + LABEL_SIZE_BYTES > size {
            continue;
        }
        let zeros = BufSlice::whole(AlignedBuf::zeroed(LABEL_SIZE_BYTES as usize).into_shared());
        device.write(offset, vec![zeros], false).await?;
    }
    device.flush().await
}

/// Writes the config area of labels `indexes` on a leaf.
pub async fn write_labels(
    leaf: &Rc<LeafVdev>,
    label: &Label,
    device_size_bytes: u64,
    indexes: &[usize],
) -> Result<(), String> {
    let bytes = label.encode().map_err(|error| error.to_string())?;
    let buffer = AlignedBuf::copy_from(&bytes).into_shared();
    let mut writes = Vec::new();
    for &index in indexes {
        let offset = label_offset(index, device_size_bytes);
        writes.push(leaf.queue.write(
            IoClass::AsyncWrite,
            offset,
            BufSlice::whole(buffer.clone()),
            IoFlags::default(),
        ));
    }
    for result in futures_util::future::join_all(writes).await {
        result.map_err(|error| format!("{}: {error}", leaf.path.borrow()))?;
    }
    Ok(())
}

/// Writes an uberblock into its ring slot in every label of a leaf.
pub async fn write_uberblock(
    leaf: &Rc<LeafVdev>,
    uberblock: &Uberblock,
    device_size_bytes: u64,
    ashift: u8,
) -> Result<(), String> {
    let slot_bytes = uberblock_slot_bytes(ashift);
    let slot = uberblock.txg % uberblock_slot_count(ashift);
    let mut buffer = AlignedBuf::zeroed(slot_bytes as usize);
    buffer[..UBERBLOCK_BYTES].copy_from_slice(&uberblock.encode());
    let buffer = buffer.into_shared();
    let mut writes = Vec::new();
    for index in 0..LABEL_COUNT {
        let offset =
            label_offset(index, device_size_bytes) + LABEL_CONFIG_BYTES + slot * slot_bytes;
        writes.push(leaf.queue.write(
            IoClass::AsyncWrite,
            offset,
            BufSlice::whole(buffer.clone()),
            IoFlags::default(),
        ));
    }
    let results = futures_util::future::join_all(writes).await;
    // One good copy of the uberblock on this device is enough; report only when
    // every label failed.
    if results.iter().any(|result| result.is_ok()) {
        return Ok(());
    }
    Err(format!(
        "{}: could not write any uberblock copy",
        leaf.path.borrow()
    ))
}
