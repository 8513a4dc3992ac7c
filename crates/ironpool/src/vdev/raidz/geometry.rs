//! Where a RAID-Z block's sectors go: OpenZFS's layout (vdev_raidz_map_alloc and
//! vdev_raidz_psize_to_asize in module/zfs/vdev_raidz.c), reimplemented from its
//! rules so that ironpool's RAID-Z groups have the same on-disk geometry.
//!
//! The group's allocatable space is seen as one sequence of sectors dealt
//! round-robin over the children: group sector `b` is sector `b / children` of
//! child `b % children`. A block of `s` data sectors at group sector `b`:
//!
//! - occupies the `tot = s + parity * ceil(s / (children - parity))` group
//!   sectors from `b` on, row by row: every row starts with `parity` parity
//!   sectors, the rest of the row is data; the last row may be short;
//! - is cut into columns: column `c` holds the block's sectors that fall on child
//!   `(b + c) % children`. So column 0 is on child `b % children` at child offset
//!   `(b / children)` sectors, and a column whose child index wrapped past the
//!   last child starts one sector further down (`+ 1` sector). Columns
//!   `0..parity` are parity, the others data. The first
//!   `bc = (s mod (children - parity)) + parity` columns (none when the rows are
//!   all full) hold one sector more than the rest;
//! - the data buffer is laid out column after column: data column `parity` gets
//!   the first bytes, and so on;
//! - is allocated `roundup(tot, parity + 1)` sectors, because parity + 1 is the
//!   smallest block that carries its parity, and rounding every allocation to it
//!   leaves no free fragment too small to use. The up to `parity` extra sectors
//!   are skip (pad) sectors: group sectors `b + tot ..`, which land right after
//!   the last sector of columns `bc, bc + 1, ..` (wrapping to column 0), or, for
//!   a block smaller than one row, in the columns that hold nothing.
//!
//! One historical wrinkle is part of the format: for single parity, when bit 20
//! of the block's offset is set (every other MiB of the group), columns 0 and 1
//! exchange their child and offset (parity moves to the first data column's
//! place), and a skip sector that would follow column 0 then follows column 1.
//! OpenZFS added it to spread parity over the children and must keep it
//! forever; so must we.

use crate::format::bp::BLOCK_SIZE_MAX_BYTES;
use crate::format::{ASHIFT_MAX, ASHIFT_MIN};

/// Fewest parity columns: RAID-Z1.
pub const PARITY_MIN: u32 = 1;
/// Most parity columns: RAID-Z3 (see `parity.rs` for why no more).
pub const PARITY_MAX: u32 = 3;
/// Most children of one group: the on-disk limit (see the label format).
pub const CHILDREN_MAX: u32 = crate::format::label::RAIDZ_CHILDREN_MAX as u32;
/// The offset bit that exchanges columns 0 and 1 of RAID-Z1 blocks (1 MiB).
pub const RAIDZ1_PARITY_SWAP_OFFSET_BIT: u64 = 1 << 20;

/// A group shape or block request RAID-Z cannot lay out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GeometryError {
    #[error("parity {parity}: RAID-Z has {PARITY_MIN} to {PARITY_MAX} parity columns")]
    ParityOutOfRange { parity: u32 },
    #[error("{children} children cannot hold {parity} parity: need {} to {CHILDREN_MAX}", parity + 1)]
    ChildrenOutOfRange { children: u32, parity: u32 },
    #[error("ashift {ashift} is outside {ASHIFT_MIN}..={ASHIFT_MAX}")]
    AshiftOutOfRange { ashift: u8 },
    #[error("a block of 0 bytes has no layout")]
    EmptyBlock,
    #[error("block of {size_bytes} bytes is larger than the {BLOCK_SIZE_MAX_BYTES}-byte maximum")]
    BlockTooLarge { size_bytes: u64 },
    #[error("offset {offset_bytes} is not a multiple of the {sector_bytes}-byte sector")]
    OffsetUnaligned {
        offset_bytes: u64,
        sector_bytes: u64,
    },
    #[error("a block at offset {offset_bytes} would end past the largest offset")]
    OffsetTooLarge { offset_bytes: u64 },
}

/// The shape of one RAID-Z group: what the layout of every block depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RaidzGeometry {
    children: u32,
    parity: u32,
    ashift: u8,
}

/// One column of a block: a contiguous run of sectors on one child.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Column {
    /// Index of the child in the group.
    pub child: u32,
    /// Where the column starts, relative to the start of the child's data area.
    pub child_offset_bytes: u64,
    /// Bytes of data or parity (a multiple of the sector; all columns of a block
    /// differ by at most one sector, the larger ones first).
    pub size_bytes: u64,
    /// A parity column (P, Q, R in this order) rather than data.
    pub is_parity: bool,
    /// For data columns: where the column's bytes start in the block's data
    /// buffer (padded to whole sectors). None for parity.
    pub data_offset_bytes: Option<u64>,
    /// Zeroed skip-sector bytes to append to this column's write (0 or one
    /// sector), so the pad goes out in the same I/O (see [`SkipWrite`]). Never
    /// read, and not part of the parity computation.
    pub appended_skip_bytes: u64,
}

/// How a skip sector is written. The contents never matter; writing one only
/// keeps a child's writes contiguous, which some devices need to stay fast.
///
/// This follows OpenZFS since 2021 (commit 345196be18, "Single IO issue for
/// raidz writes with skip sector"): a skip sector that follows one of the
/// block's own columns on the same child is zero-filled and appended to that
/// column's write; one on a child the block does not otherwise touch (only in
/// blocks smaller than one row) is a separate one-sector optional write, which
/// the queue merges into a neighbouring aggregate (even past its size limit,
/// OpenZFS 8005) and drops when alone. Before 2021 every skip sector was such an
/// optional write at the same place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkipWrite {
    /// Written as zeros at the end of column `column_index`'s write.
    AppendedToColumn { column_index: usize },
    /// A separate optional one-sector write (`IoFlags::optional`).
    Optional,
}

/// One skip (pad) sector of a block's allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SkipSector {
    /// Index of the child in the group.
    pub child: u32,
    /// Offset on the child, relative to its data area.
    pub child_offset_bytes: u64,
    /// How it is written.
    pub write: SkipWrite,
}

/// The layout of one block: its columns in map order (parity first) and its
/// skip sectors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RaidzMap {
    /// Parity columns, then data columns, in the order parity is computed over.
    pub columns: Vec<Column>,
    /// Index of the first data column: the parity count.
    pub data_columns_first: usize,
    /// The pad sectors that round the allocation up to a multiple of parity + 1.
    pub skip_sectors: Vec<SkipSector>,
    /// Bytes per sector.
    pub sector_bytes: u64,
    /// The block's size rounded up to whole sectors: the length of the data
    /// buffer the data columns split (the tail beyond the block is zeros).
    pub data_size_bytes: u64,
    /// Bytes the block takes from the group's space (the allocator's size).
    pub allocated_size_bytes: u64,
}

impl RaidzGeometry {
    /// A group of `children` devices with `parity` parity columns and
    /// `2^ashift`-byte sectors.
    pub fn new(children: u32, parity: u32, ashift: u8) -> Result<RaidzGeometry, GeometryError> {
        if !(PARITY_MIN..=PARITY_MAX).contains(&parity) {
            return Err(GeometryError::ParityOutOfRange { parity });
        }
        if children < parity + 1 || children > CHILDREN_MAX {
            return Err(GeometryError::ChildrenOutOfRange { children, parity });
        }
        if !(ASHIFT_MIN..=ASHIFT_MAX).contains(&ashift) {
            return Err(GeometryError::AshiftOutOfRange { ashift });
        }
        Ok(RaidzGeometry {
            children,
            parity,
            ashift,
        })
    }

    /// Number of children.
    pub fn children(&self) -> u32 {
        self.children
    }

    /// Number of parity columns per row.
    pub fn parity(&self) -> u32 {
        self.parity
    }

    /// log2 of the sector size.
    pub fn ashift(&self) -> u8 {
        self.ashift
    }

    /// Bytes per sector.
    pub fn sector_bytes(&self) -> u64 {
        1 << self.ashift
    }

    /// Where the sectors of the group's range `[offset, offset + length)`
    /// lie on the children: `(child, child offset, bytes)`, each child's
    /// share contiguous (group sector `b` is child `b % children`'s sector
    /// `b / children`). What a discard of free group space discards, and
    /// nothing of the sectors around it.
    pub fn child_ranges(&self, offset_bytes: u64, length_bytes: u64) -> Vec<(u32, u64, u64)> {
        let children = u64::from(self.children);
        let first = offset_bytes >> self.ashift;
        let end = (offset_bytes + length_bytes) >> self.ashift;
        (0..children)
            .filter_map(|child| {
                // Child sectors k with first <= k * children + child < end.
                let from = first.saturating_sub(child).div_ceil(children);
                let to = end.saturating_sub(child).div_ceil(children);
                (to > from).then(|| {
                    (
                        child as u32,
                        from << self.ashift,
                        (to - from) << self.ashift,
                    )
                })
            })
            .collect()
    }

    /// Bytes a block of `psize_bytes` takes from the group: its data sectors plus
    /// one parity sector per parity column for every row it touches, rounded up
    /// to a multiple of parity + 1 sectors (OpenZFS's psize_to_asize). 0 for 0.
    /// Exact for any size whose result fits in a u64; saturates beyond (sizes no
    /// block has: they are over [`BLOCK_SIZE_MAX_BYTES`]).
    pub fn asize(&self, psize_bytes: u64) -> u64 {
        if psize_bytes == 0 {
            return 0;
        }
        let data_sectors = u128::from(psize_bytes.div_ceil(self.sector_bytes()));
        let total_sectors = data_sectors + self.parity_sectors(data_sectors);
        let allocated_sectors = total_sectors.next_multiple_of(u128::from(self.parity) + 1);
        u64::try_from(allocated_sectors << self.ashift).unwrap_or(u64::MAX)
    }

    /// Bytes of parity a block of `psize_bytes` has: one sector per parity
    /// column for every row it touches (what `asize` adds to the data before
    /// rounding), without building its map.
    pub fn parity_bytes(&self, psize_bytes: u64) -> u64 {
        let data_sectors = u128::from(psize_bytes.div_ceil(self.sector_bytes()));
        u64::try_from(self.parity_sectors(data_sectors) << self.ashift).unwrap_or(u64::MAX)
    }

    /// Parity sectors of a block of `data_sectors`: `parity` per row.
    fn parity_sectors(&self, data_sectors: u128) -> u128 {
        u128::from(self.parity) * data_sectors.div_ceil(u128::from(self.children - self.parity))
    }

    /// The layout of a block of `psize_bytes` at `offset_bytes` in the group's
    /// allocatable space (sector aligned; the offset a block pointer records).
    pub fn map(&self, offset_bytes: u64, psize_bytes: u64) -> Result<RaidzMap, GeometryError> {
        let sector_bytes = self.sector_bytes();
        if psize_bytes == 0 {
            return Err(GeometryError::EmptyBlock);
        }
        if psize_bytes > u64::from(BLOCK_SIZE_MAX_BYTES) {
            return Err(GeometryError::BlockTooLarge {
                size_bytes: psize_bytes,
            });
        }
        if !offset_bytes.is_multiple_of(sector_bytes) {
            return Err(GeometryError::OffsetUnaligned {
                offset_bytes,
                sector_bytes,
            });
        }
        let allocated_size_bytes = self.asize(psize_bytes);
        if offset_bytes.checked_add(allocated_size_bytes).is_none() {
            return Err(GeometryError::OffsetTooLarge { offset_bytes });
        }
        let shape = self.shape(offset_bytes, psize_bytes);
        debug_assert_eq!(
            (shape.total_sectors + shape.skip_count) << self.ashift,
            allocated_size_bytes
        );
        let mut columns = self.columns(&shape);
        let mut skip_start_column = shape.big_columns;
        if self.parity == 1 && offset_bytes & RAIDZ1_PARITY_SWAP_OFFSET_BIT != 0 {
            let (first, second) = (columns[0], columns[1]);
            (columns[0].child, columns[0].child_offset_bytes) =
                (second.child, second.child_offset_bytes);
            (columns[1].child, columns[1].child_offset_bytes) =
                (first.child, first.child_offset_bytes);
            // A skip sector after column 0's place now follows column 1.
            if skip_start_column == 0 {
                skip_start_column = 1;
            }
        }
        let skip_sectors = self.skip_sectors(&shape, &mut columns, skip_start_column);
        Ok(RaidzMap {
            columns,
            data_columns_first: self.parity as usize,
            skip_sectors,
            sector_bytes,
            data_size_bytes: shape.data_sectors << self.ashift,
            allocated_size_bytes,
        })
    }

    /// The numbers a block's layout follows from (OpenZFS's b, s, f, o, q, r, bc,
    /// tot, acols, scols, nskip).
    fn shape(&self, offset_bytes: u64, psize_bytes: u64) -> BlockShape {
        let children = u64::from(self.children);
        let parity = u64::from(self.parity);
        let start_sector = offset_bytes >> self.ashift;
        let data_sectors = psize_bytes.div_ceil(self.sector_bytes());
        let full_rows = data_sectors / (children - parity);
        let remainder_sectors = data_sectors % (children - parity);
        let big_columns = if remainder_sectors == 0 {
            0
        } else {
            remainder_sectors + parity
        };
        let total_sectors = data_sectors + parity * (full_rows + u64::from(remainder_sectors != 0));
        // A block smaller than one row touches only its big columns; the columns
        // after them up to the rounded-up size (at most every child) hold only
        // skip sectors.
        let (accessed_columns, spanned_columns) = if full_rows == 0 {
            (
                big_columns,
                children.min(big_columns.next_multiple_of(parity + 1)),
            )
        } else {
            (children, children)
        };
        BlockShape {
            first_child: start_sector % children,
            row_offset_bytes: (start_sector / children) << self.ashift,
            data_sectors,
            full_rows,
            big_columns,
            total_sectors,
            accessed_columns,
            spanned_columns,
            skip_count: total_sectors.next_multiple_of(parity + 1) - total_sectors,
        }
    }

    /// Where column `column` starts: its child, and one sector further down when
    /// the child index wrapped past the last child.
    fn position(&self, shape: &BlockShape, column: u64) -> (u32, u64) {
        let children = u64::from(self.children);
        let child = shape.first_child + column;
        if child >= children {
            (
                (child - children) as u32,
                shape.row_offset_bytes + self.sector_bytes(),
            )
        } else {
            (child as u32, shape.row_offset_bytes)
        }
    }

    /// The block's columns before the RAID-Z1 swap: sizes, places, roles, and
    /// where each data column's bytes are in the data buffer.
    fn columns(&self, shape: &BlockShape) -> Vec<Column> {
        let mut columns = Vec::with_capacity(shape.accessed_columns as usize);
        let mut data_offset_bytes = 0;
        for column in 0..shape.accessed_columns {
            let (child, child_offset_bytes) = self.position(shape, column);
            let sectors = if column < shape.big_columns {
                shape.full_rows + 1
            } else {
                shape.full_rows
            };
            let size_bytes = sectors << self.ashift;
            let is_parity = column < u64::from(self.parity);
            let data_offset = if is_parity {
                None
            } else {
                Some(data_offset_bytes)
            };
            if !is_parity {
                data_offset_bytes += size_bytes;
            }
            columns.push(Column {
                child,
                child_offset_bytes,
                size_bytes,
                is_parity,
                data_offset_bytes: data_offset,
                appended_skip_bytes: 0,
            });
        }
        debug_assert_eq!(data_offset_bytes, shape.data_sectors << self.ashift);
        debug_assert_eq!(
            columns.iter().map(|column| column.size_bytes).sum::<u64>(),
            shape.total_sectors << self.ashift
        );
        // Every block has at least one parity and one data column, and columns 0
        // and 1 are the same size (the RAID-Z1 swap relies on it).
        assert!(columns.len() >= 2 && columns[0].size_bytes == columns[1].size_bytes);
        columns
    }

    /// Places the skip sectors: from column `skip_start_column` on, wrapping at
    /// the spanned width. One in a column the block uses follows that column
    /// (and is appended to its write); one in a column it does not use is that
    /// column's first sector, an optional write.
    fn skip_sectors(
        &self,
        shape: &BlockShape,
        columns: &mut [Column],
        skip_start_column: u64,
    ) -> Vec<SkipSector> {
        let mut skip_sectors = Vec::with_capacity(shape.skip_count as usize);
        for skip in 0..shape.skip_count {
            let column = (skip_start_column + skip) % shape.spanned_columns;
            let skip_sector = if column < shape.accessed_columns {
                let owner = &mut columns[column as usize];
                let child_offset_bytes = owner.child_offset_bytes + owner.size_bytes;
                owner.appended_skip_bytes += self.sector_bytes();
                SkipSector {
                    child: owner.child,
                    child_offset_bytes,
                    write: SkipWrite::AppendedToColumn {
                        column_index: column as usize,
                    },
                }
            } else {
                let (child, child_offset_bytes) = self.position(shape, column);
                SkipSector {
                    child,
                    child_offset_bytes,
                    write: SkipWrite::Optional,
                }
            };
            skip_sectors.push(skip_sector);
        }
        skip_sectors
    }
}

/// A block's layout numbers, in sectors unless named otherwise.
struct BlockShape {
    /// Child of column 0 (before the RAID-Z1 swap).
    first_child: u64,
    /// Child offset of the group row the block starts in.
    row_offset_bytes: u64,
    /// The block's size in whole sectors.
    data_sectors: u64,
    /// Rows whose every data column is full.
    full_rows: u64,
    /// Columns one sector longer than the rest (0 when the rows are all full).
    big_columns: u64,
    /// Data plus parity sectors.
    total_sectors: u64,
    /// Columns holding data or parity.
    accessed_columns: u64,
    /// Columns holding data, parity or skip sectors (skips wrap at this width).
    spanned_columns: u64,
    /// Pad sectors rounding the allocation to a multiple of parity + 1.
    skip_count: u64,
}

impl RaidzMap {
    /// The parity columns (P, then Q, then R).
    pub fn parity_columns(&self) -> &[Column] {
        &self.columns[..self.data_columns_first]
    }

    /// The data columns, in the order their bytes follow each other in the data
    /// buffer and in the parity equations.
    pub fn data_columns(&self) -> &[Column] {
        &self.columns[self.data_columns_first..]
    }

    /// Bytes of the one parity column length (every parity column is this long).
    pub fn parity_column_bytes(&self) -> u64 {
        self.columns[0].size_bytes
    }

    /// The data columns' slices of `data` (which must be `data_size_bytes`
    /// long), ready for parity generation.
    pub fn split_data<'a>(&self, data: &'a [u8]) -> Vec<&'a [u8]> {
        assert_eq!(
            data.len() as u64,
            self.data_size_bytes,
            "data buffer length"
        );
        let mut rest = data;
        let mut slices = Vec::with_capacity(self.columns.len() - self.data_columns_first);
        for column in self.data_columns() {
            let (head, tail) = rest.split_at(column.size_bytes as usize);
            slices.push(head);
            rest = tail;
        }
        slices
    }

    /// The data columns' mutable slices of `data` (which must be
    /// `data_size_bytes` long): where reconstruction writes rebuilt columns.
    pub fn split_data_mut<'a>(&self, data: &'a mut [u8]) -> Vec<&'a mut [u8]> {
        assert_eq!(
            data.len() as u64,
            self.data_size_bytes,
            "data buffer length"
        );
        let mut rest = data;
        let mut slices = Vec::with_capacity(self.columns.len() - self.data_columns_first);
        for column in self.data_columns() {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(column.size_bytes as usize);
            slices.push(head);
            rest = tail;
        }
        slices
    }
}

#[cfg(test)]
mod tests;
