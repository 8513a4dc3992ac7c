//! A RAID-Z group's reads and writes through its children's queues, on top of
//! the pure layout ([`super::geometry`]) and parity ([`super::parity`]) code.
//!
//! - **Write** ([`plan_write`], carried out by [`crate::vdev::run`]): compute
//!   the parity columns, then one piece per column on its child (no copy: data
//!   columns are slices of the block's buffer), a zero pad right after a column
//!   that owns a skip sector (it merges with the column's write), and an
//!   optional one-sector write for a skip sector on a child the block does not
//!   otherwise touch (the queue joins it to a neighbouring write when it fills
//!   a gap, and drops it when alone). Blocks written together have their
//!   consecutive pieces on a child merged into one request. Children that are
//!   away, or whose column fails, are reported as missed; the write fails only
//!   when more columns than parity were lost.
//! - **Read**: the data columns only. When one cannot be read, or the block's
//!   checksum does not match, read every column and [`recover`]: reconstruct
//!   sets of up to `parity` columns, smallest sets first, until the checksum
//!   matches. The columns in the winning set that were read are wrong (counted
//!   as checksum errors); parity columns that disagree with the recovered block
//!   are wrong too. Children that missed the block's txg are not read unless
//!   nothing else works.
//! - **Scrub**: every column, then the same recovery, and parity is always
//!   checked: a scrub finds bad parity that reads never look at.
//! - **Repair**: rewrite a child's column from the good block (parity
//!   recomputed).

use super::geometry::{RaidzMap, SkipWrite};
use super::parity::{generate_parity, reconstruct};
use super::RaidzGeometry;
use crate::dev::DeviceError;
use crate::format::DATA_START_BYTES;
use crate::queue::{IoClass, IoFlags};
use crate::rt::buf::{AlignedBuf, BufSlice};
use crate::vdev::run::{Piece, Plan, Survives};
use crate::vdev::{TopVdev, VdevError, VerifiedRead};

/// Most reconstructions tried for one block before it is declared unreadable.
/// Sets are tried smallest first, so every single and double column failure
/// of any group up to 255 wide is covered (255 + 255 * 254 / 2 = 32,640 sets
/// with nothing erased); only triple failures in groups wider than about 60
/// columns can run out. It bounds the time the engine thread spends on one
/// hopeless block (each attempt costs a parity pass over the block).
pub const RECONSTRUCTION_ATTEMPTS_MAX: usize = 40_000;

/// What is known about one column of a block being read.
enum Slot {
    /// Not asked for (yet).
    Unread,
    /// Its child is not in service: nothing to read, nothing to repair now.
    Away,
    /// Its child is online but missed the block's txg: its bytes are not to be
    /// trusted (read only as a last resort).
    Stale,
    /// The read failed.
    Failed,
    /// Bytes as the child returned them.
    Read(AlignedBuf),
    /// Bytes of a stale child, read as a last resort.
    ReadStale(AlignedBuf),
}

impl Slot {
    fn bytes(&self) -> Option<&AlignedBuf> {
        match self {
            Slot::Read(bytes) | Slot::ReadStale(bytes) => Some(bytes),
            _ => None,
        }
    }
}

/// The block recovered from its columns.
struct Recovered {
    data: AlignedBuf,
    /// Columns that held wrong bytes (read fine, but not what was written).
    wrong_columns: Vec<usize>,
}

/// Writing a block: its parity, then every column on its child (data
/// columns are slices of the block, never copied), a zero pad right after a
/// column that owns a skip sector, and an optional pad for a skip sector on a
/// child the block does not otherwise touch. Children that are away miss it.
/// `ahead` is the block's parity when it was computed earlier (see
/// [`PrecomputedParity`]); used when it was computed for this geometry and size.
pub(in crate::vdev) fn plan_write(
    top: &TopVdev,
    geometry: &RaidzGeometry,
    offset: u64,
    data: &BufSlice,
    ahead: Option<&PrecomputedParity>,
) -> Result<Plan, VdevError> {
    let map = geometry.map(offset, data.len() as u64)?;
    assert_eq!(
        data.len() as u64,
        map.data_size_bytes,
        "a RAID-Z write takes the block in whole sectors"
    );
    let parity = match ahead {
        Some(ahead) if ahead.fits(geometry, data.len()) => ahead.columns.clone(),
        _ => compute_parity(&map, data),
    };
    let pad = zero_sector(map.sector_bytes as usize);
    let mut pieces = Vec::with_capacity(map.columns.len() + map.skip_sectors.len());
    let mut missed = Vec::new();
    for (index, column) in map.columns.iter().enumerate() {
        let child = column.child as usize;
        if !top.children[child].is_online() {
            missed.push(child);
            continue;
        }
        let absolute = DATA_START_BYTES + column.child_offset_bytes;
        pieces.push(Piece {
            child,
            offset: absolute,
            data: column_payload(&map, index, data, &parity),
            optional: false,
            counts: true,
        });
        if column.appended_skip_bytes > 0 {
            debug_assert_eq!(column.appended_skip_bytes, map.sector_bytes);
            pieces.push(Piece {
                child,
                offset: absolute + column.size_bytes,
                data: pad.clone(),
                optional: false,
                counts: false,
            });
        }
    }
    for skip in map
        .skip_sectors
        .iter()
        .filter(|skip| skip.write == SkipWrite::Optional)
    {
        let child = skip.child as usize;
        if top.children[child].is_online() {
            pieces.push(Piece {
                child,
                offset: DATA_START_BYTES + skip.child_offset_bytes,
                data: pad.clone(),
                optional: true,
                counts: false,
            });
        }
    }
    Ok(Plan::new(
        pieces,
        missed,
        Survives::Parity {
            parity: geometry.parity() as usize,
            columns: map.columns.len(),
        },
    ))
}

/// Rewrites the columns that `children` hold (a child may hold none of a
/// small block). Fails, writing nothing, when one of them is away.
pub(in crate::vdev) async fn repair(
    top: &TopVdev,
    geometry: &RaidzGeometry,
    children: &[usize],
    offset: u64,
    data: BufSlice,
    class: IoClass,
) -> Result<(), DeviceError> {
    let map = geometry
        .map(offset, data.len() as u64)
        .map_err(|error| DeviceError::Io(format!("no layout to repair: {error}")))?;
    let targets: Vec<usize> = (0..map.columns.len())
        .filter(|index| children.contains(&(map.columns[*index].child as usize)))
        .collect();
    if targets
        .iter()
        .any(|index| !top.children[map.columns[*index].child as usize].is_online())
    {
        return Err(DeviceError::Missing);
    }
    if targets.is_empty() {
        return Ok(());
    }
    let parity = if targets.iter().any(|index| map.columns[*index].is_parity) {
        compute_parity(&map, &data)
    } else {
        Vec::new()
    };
    let flags = IoFlags {
        repair: true,
        ..IoFlags::default()
    };
    let writes = targets.iter().map(|&index| {
        let column = &map.columns[index];
        top.children[column.child as usize].queue.write(
            class,
            DATA_START_BYTES + column.child_offset_bytes,
            column_payload(&map, index, &data, &parity),
            flags,
        )
    });
    let results = futures_util::future::join_all(writes).await;
    let mut outcome = Ok(());
    for (index, result) in targets.into_iter().zip(results) {
        let column = &map.columns[index];
        match result {
            Ok(()) => top.children[column.child as usize]
                .queue
                .count(|stats| stats.repaired_bytes += column.size_bytes),
            Err(error) => outcome = Err(error),
        }
    }
    outcome
}

/// Reads a block: data columns, and reconstruction when they do not verify.
pub(in crate::vdev) async fn read_verified(
    top: &TopVdev,
    geometry: &RaidzGeometry,
    class: IoClass,
    offset: u64,
    length: u64,
    birth_txg: u64,
    verify: &dyn Fn(&[u8]) -> bool,
) -> Result<VerifiedRead, VdevError> {
    let map = geometry.map(offset, length)?;
    let mut slots: Vec<Slot> = map.columns.iter().map(|_| Slot::Unread).collect();
    let data_columns: Vec<usize> = (map.data_columns_first..map.columns.len()).collect();
    read_columns(
        top,
        &map,
        &data_columns,
        birth_txg,
        class,
        IoFlags::default(),
        &mut slots,
    )
    .await;
    if data_columns
        .iter()
        .all(|index| matches!(slots[*index], Slot::Read(_)))
    {
        let data = assemble(&map, |index| slots[index].bytes());
        if verify(&data) {
            return Ok(VerifiedRead {
                data,
                bad_children: Vec::new(),
            });
        }
    }
    let parity_columns: Vec<usize> = (0..map.data_columns_first).collect();
    read_columns(
        top,
        &map,
        &parity_columns,
        birth_txg,
        class,
        IoFlags::default(),
        &mut slots,
    )
    .await;
    let recovered = match recover(&map, geometry.parity() as usize, &slots, verify) {
        Some(recovered) => recovered,
        None => {
            // Last resort: the children that missed this txg may still hold
            // the block (a txg is only partly missed).
            if !read_stale_columns(top, &map, class, IoFlags::default(), &mut slots).await {
                return Err(unrecoverable(top, &map, &slots));
            }
            recover(&map, geometry.parity() as usize, &slots, verify)
                .ok_or_else(|| unrecoverable(top, &map, &slots))?
        }
    };
    let bad_children = blame(top, &map, &slots, &recovered, false);
    Ok(VerifiedRead {
        data: recovered.data,
        bad_children,
    })
}

/// Reads every column of a block and checks data and parity: the verified
/// block and the children whose column must be rewritten, or None when the
/// block cannot be recovered.
pub(in crate::vdev) async fn scrub_read(
    top: &TopVdev,
    geometry: &RaidzGeometry,
    offset: u64,
    length: u64,
    birth_txg: u64,
    verify: &dyn Fn(&[u8]) -> bool,
) -> (Option<AlignedBuf>, Vec<usize>) {
    let Ok(map) = geometry.map(offset, length) else {
        return (None, Vec::new());
    };
    let mut slots: Vec<Slot> = map.columns.iter().map(|_| Slot::Unread).collect();
    let all: Vec<usize> = (0..map.columns.len()).collect();
    let flags = IoFlags {
        scrub: true,
        ..IoFlags::default()
    };
    read_columns(
        top,
        &map,
        &all,
        birth_txg,
        IoClass::Scrub,
        flags,
        &mut slots,
    )
    .await;
    let mut recovered = recover(&map, geometry.parity() as usize, &slots, verify);
    if recovered.is_none() && read_stale_columns(top, &map, IoClass::Scrub, flags, &mut slots).await
    {
        recovered = recover(&map, geometry.parity() as usize, &slots, verify);
    }
    match recovered {
        Some(recovered) => {
            let bad = blame(top, &map, &slots, &recovered, true);
            (Some(recovered.data), bad)
        }
        None => (None, Vec::new()),
    }
}

/// Reads the columns `indices` whose children can serve the block; marks the
/// others away or stale.
async fn read_columns(
    top: &TopVdev,
    map: &RaidzMap,
    indices: &[usize],
    birth_txg: u64,
    class: IoClass,
    flags: IoFlags,
    slots: &mut [Slot],
) {
    let mut wanted = Vec::with_capacity(indices.len());
    for &index in indices {
        let leaf = &top.children[map.columns[index].child as usize];
        if !leaf.is_online() {
            slots[index] = Slot::Away;
        } else if !leaf.is_readable_for(birth_txg) {
            slots[index] = Slot::Stale;
        } else {
            wanted.push(index);
        }
    }
    let reads = wanted.iter().map(|&index| {
        let column = &map.columns[index];
        top.children[column.child as usize].queue.read(
            class,
            DATA_START_BYTES + column.child_offset_bytes,
            column.size_bytes,
            flags,
        )
    });
    for (index, result) in wanted
        .iter()
        .zip(futures_util::future::join_all(reads).await)
    {
        slots[*index] = match result {
            Ok(bytes) => Slot::Read(bytes),
            Err(_) => Slot::Failed,
        };
    }
}

/// Reads the columns of stale children. False when there were none.
async fn read_stale_columns(
    top: &TopVdev,
    map: &RaidzMap,
    class: IoClass,
    flags: IoFlags,
    slots: &mut [Slot],
) -> bool {
    let stale: Vec<usize> = (0..slots.len())
        .filter(|index| matches!(slots[*index], Slot::Stale))
        .collect();
    if stale.is_empty() {
        return false;
    }
    let reads = stale.iter().map(|&index| {
        let column = &map.columns[index];
        top.children[column.child as usize].queue.read(
            class,
            DATA_START_BYTES + column.child_offset_bytes,
            column.size_bytes,
            flags,
        )
    });
    for (index, result) in stale
        .iter()
        .zip(futures_util::future::join_all(reads).await)
    {
        slots[*index] = match result {
            Ok(bytes) => Slot::ReadStale(bytes),
            Err(_) => Slot::Failed,
        };
    }
    true
}

/// Finds the block from the columns at hand: the columns without bytes are
/// always rebuilt; on top of them, sets of read columns are rebuilt too,
/// smallest sets first (the fewest columns blamed), until the block checksum
/// matches. None when no set of at most `parity` columns gives a block that
/// verifies, or `RECONSTRUCTION_ATTEMPTS_MAX` sets were tried.
fn recover(
    map: &RaidzMap,
    parity: usize,
    slots: &[Slot],
    verify: &dyn Fn(&[u8]) -> bool,
) -> Option<Recovered> {
    let erased: Vec<usize> = (0..slots.len())
        .filter(|index| slots[*index].bytes().is_none())
        .collect();
    if erased.len() > parity {
        return None;
    }
    let candidates: Vec<usize> = (0..slots.len())
        .filter(|index| slots[*index].bytes().is_some())
        .collect();
    let mut work: Vec<AlignedBuf> = map
        .columns
        .iter()
        .zip(slots)
        .map(|(column, slot)| {
            slot.bytes()
                .map(|bytes| AlignedBuf::copy_from(bytes))
                .unwrap_or_else(|| AlignedBuf::zeroed(column.size_bytes as usize))
        })
        .collect();
    let mut attempts = 0;
    let mut raw_data_tried = false;
    for extra in 0..=parity - erased.len() {
        let mut chosen: Vec<usize> = (0..extra).collect();
        loop {
            if attempts >= RECONSTRUCTION_ATTEMPTS_MAX {
                return None;
            }
            if extra > candidates.len() {
                break;
            }
            let mut missing = erased.clone();
            missing.extend(chosen.iter().map(|position| candidates[*position]));
            // Rebuilding parity alone leaves the data as read: worth one check.
            let touches_data = missing.iter().any(|index| *index >= map.data_columns_first);
            if touches_data || !raw_data_tried {
                raw_data_tried |= !touches_data;
                attempts += 1;
                if let Some(data) = attempt(map, parity, slots, &mut work, &missing, verify) {
                    let wrong_columns = chosen
                        .iter()
                        .map(|position| candidates[*position])
                        .collect();
                    return Some(Recovered {
                        data,
                        wrong_columns,
                    });
                }
            }
            if !next_combination(&mut chosen, candidates.len()) {
                break;
            }
        }
    }
    None
}

/// One reconstruction: rebuilds `missing` in `work` (first restoring every
/// read column to its bytes as read) and returns the block if it verifies.
fn attempt(
    map: &RaidzMap,
    parity: usize,
    slots: &[Slot],
    work: &mut [AlignedBuf],
    missing: &[usize],
    verify: &dyn Fn(&[u8]) -> bool,
) -> Option<AlignedBuf> {
    for (buffer, slot) in work.iter_mut().zip(slots) {
        if let Some(bytes) = slot.bytes() {
            buffer.copy_from_slice(bytes);
        }
    }
    if !missing.is_empty() {
        let mut columns: Vec<&mut [u8]> = work.iter_mut().map(|buffer| &mut buffer[..]).collect();
        reconstruct(&mut columns, parity, missing).ok()?;
    }
    let data = assemble(map, |index| Some(&work[index]));
    verify(&data).then_some(data)
}

/// The children to repair after a recovery, counting checksum errors on those
/// that returned wrong bytes: failed reads, wrong columns, and parity columns
/// that disagree with the recovered block. A scrub also repairs the children
/// that missed the block's txg (that is a resilver of this block).
fn blame(
    top: &TopVdev,
    map: &RaidzMap,
    slots: &[Slot],
    recovered: &Recovered,
    include_stale: bool,
) -> Vec<usize> {
    let mut bad: Vec<usize> = Vec::new();
    let mut push = |index: usize, checksum_error: bool| {
        let column = &map.columns[index];
        let child = column.child as usize;
        if checksum_error {
            let what = if column.is_parity { "parity" } else { "data" };
            top.children[child].queue.checksum_error(
                DATA_START_BYTES + column.child_offset_bytes,
                column.size_bytes,
                &format!("{what} column {index} of a RAID-Z block does not match its checksum"),
            );
        }
        if !bad.contains(&child) {
            bad.push(child);
        }
    };
    for index in &recovered.wrong_columns {
        push(*index, matches!(slots[*index], Slot::Read(_)));
    }
    let parity_read: Vec<usize> = (0..map.data_columns_first)
        .filter(|index| slots[*index].bytes().is_some() && !recovered.wrong_columns.contains(index))
        .collect();
    if !parity_read.is_empty() {
        let expected = compute_parity(map, &recovered.data);
        for index in parity_read {
            let read = slots[index]
                .bytes()
                .map(|bytes| &bytes[..])
                .unwrap_or_default();
            if read != &expected[index][..] {
                push(index, matches!(slots[index], Slot::Read(_)));
            }
        }
    }
    for (index, slot) in slots.iter().enumerate() {
        match slot {
            Slot::Failed => push(index, false),
            Slot::Stale | Slot::ReadStale(_) if include_stale => push(index, false),
            _ => {}
        }
    }
    bad
}

/// The error for a block no reconstruction could recover.
fn unrecoverable(top: &TopVdev, map: &RaidzMap, slots: &[Slot]) -> VdevError {
    let states: Vec<String> = map
        .columns
        .iter()
        .zip(slots)
        .map(|(column, slot)| {
            let state = match slot {
                Slot::Unread => "unread",
                Slot::Away => "away",
                Slot::Stale => "missed this txg",
                Slot::Failed => "read error",
                Slot::Read(_) | Slot::ReadStale(_) => "read",
            };
            format!(
                "{}: {state}",
                top.children[column.child as usize].path.borrow()
            )
        })
        .collect();
    VdevError::TooManyFailures(format!(
        "no combination of up to {} columns verifies ({})",
        map.data_columns_first,
        states.join(", ")
    ))
}

thread_local! {
    /// Zeros for pad sectors, shared by every write of this thread (pads are
    /// at most one sector of the largest ashift).
    static ZERO_SECTOR: std::rc::Rc<AlignedBuf> = AlignedBuf::zeroed(1 << crate::format::ASHIFT_MAX).into_shared();
}

/// One pad sector of zeros.
fn zero_sector(sector_bytes: usize) -> BufSlice {
    ZERO_SECTOR.with(|zeros| BufSlice::new(zeros.clone(), 0..sector_bytes))
}

/// A block's parity columns computed before the block has a place: when the
/// write-back holds a block its bytes are still in the CPU cache (just
/// received); at write-out, up to `dirty_data_max_bytes` later, they are not,
/// and generating parity there spent most of its time waiting on loads.
///
/// It fits wherever the block lands: a block's column sizes and the split of
/// its bytes into data columns follow from the group's geometry and the
/// block's size alone (the offset only picks which child holds which column,
/// and RAID-Z1's swap exchanges two columns of the same size), so parity
/// computed at offset 0 is the parity at any offset.
pub struct PrecomputedParity {
    geometry: RaidzGeometry,
    data_bytes: usize,
    columns: Vec<std::rc::Rc<AlignedBuf>>,
}

impl PrecomputedParity {
    /// The parity of `data` as a block of `geometry`; None when `data` is not a
    /// whole number of sectors or too large for a block (then it is computed,
    /// or refused, at write-out as usual).
    pub fn compute(geometry: &RaidzGeometry, data: &[u8]) -> Option<PrecomputedParity> {
        if !Self::applies(geometry, data.len() as u64) {
            return None;
        }
        let map = geometry.map(0, data.len() as u64).ok()?;
        Some(PrecomputedParity {
            geometry: *geometry,
            data_bytes: data.len(),
            columns: compute_parity(&map, data),
        })
    }

    /// Memory it holds (counted against the write-back's dirty limit).
    pub fn bytes(&self) -> u64 {
        self.columns.iter().map(|column| column.len() as u64).sum()
    }

    /// What `compute` would hold for a block of `data_bytes` (0 when it
    /// computes none), known without computing it: write-back admits a write
    /// for its blocks with their parity.
    pub fn bytes_for(geometry: &RaidzGeometry, data_bytes: u64) -> u64 {
        if Self::applies(geometry, data_bytes) {
            geometry.parity_bytes(data_bytes)
        } else {
            0
        }
    }

    /// Whether a block of `data_bytes` gets parity ahead: whole sectors, and
    /// a size a block may have.
    fn applies(geometry: &RaidzGeometry, data_bytes: u64) -> bool {
        data_bytes > 0
            && data_bytes.is_multiple_of(geometry.sector_bytes())
            && data_bytes <= u64::from(crate::format::bp::BLOCK_SIZE_MAX_BYTES)
    }

    /// Whether it is the parity a block of `data_bytes` on `geometry` needs.
    fn fits(&self, geometry: &RaidzGeometry, data_bytes: usize) -> bool {
        self.geometry == *geometry && self.data_bytes == data_bytes
    }
}

/// The block's parity columns, computed from its data.
fn compute_parity(map: &RaidzMap, data: &[u8]) -> Vec<std::rc::Rc<AlignedBuf>> {
    let bytes = map.parity_column_bytes() as usize;
    let mut parity: Vec<AlignedBuf> = (0..map.data_columns_first)
        .map(|_| AlignedBuf::for_overwrite(bytes))
        .collect();
    let mut outputs: Vec<&mut [u8]> = parity.iter_mut().map(|buffer| &mut buffer[..]).collect();
    // The map's columns always have a shape parity accepts (the geometry's
    // invariants: 1-3 parity columns as long as the longest data column).
    generate_parity(&mut outputs, &map.split_data(data))
        .expect("a RAID-Z map has a valid parity shape");
    parity.into_iter().map(AlignedBuf::into_shared).collect()
}

/// What column `index` writes: a slice of the block, or its parity buffer.
fn column_payload(
    map: &RaidzMap,
    index: usize,
    data: &BufSlice,
    parity: &[std::rc::Rc<AlignedBuf>],
) -> BufSlice {
    let column = &map.columns[index];
    match column.data_offset_bytes {
        Some(start) => data.slice(start as usize..(start + column.size_bytes) as usize),
        None => BufSlice::whole(parity[index].clone()),
    }
}

/// The block's bytes from its data columns.
fn assemble<'a>(
    map: &RaidzMap,
    column_bytes: impl Fn(usize) -> Option<&'a AlignedBuf>,
) -> AlignedBuf {
    let mut data = AlignedBuf::for_overwrite(map.data_size_bytes as usize);
    for (index, column) in map.columns.iter().enumerate().skip(map.data_columns_first) {
        let start = column
            .data_offset_bytes
            .expect("data columns have a data offset") as usize;
        let target = &mut data[start..start + column.size_bytes as usize];
        match column_bytes(index) {
            Some(bytes) => target.copy_from_slice(&bytes[..column.size_bytes as usize]),
            None => target.fill(0),
        }
    }
    data
}

/// Steps `chosen` (strictly increasing positions below `count`) to the next
/// combination of the same size in lexicographic order; false after the last.
fn next_combination(chosen: &mut [usize], count: usize) -> bool {
    let size = chosen.len();
    for position in (0..size).rev() {
        if chosen[position] < count - (size - position) {
            chosen[position] += 1;
            for later in position + 1..size {
                chosen[later] = chosen[later - 1] + 1;
            }
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests;
