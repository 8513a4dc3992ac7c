//! RAID-Z: the pure parts of a parity group, kept apart from I/O so they can be
//! tested exhaustively and reasoned about alone.
//!
//! - [`geometry`]: where a block's data, parity and pad sectors go on the
//!   children, and how much space it takes: OpenZFS's layout, so the format
//!   matches (docs/FORMAT.md, "RAID-Z", has it in prose with a worked
//!   example; docs/RAIDZ.md covers reads, repair and resilver).
//! - [`parity`]: P, Q and R parity over GF(2^8), and reconstruction of any up to
//!   `parity` erased columns, with SIMD (SSSE3, AVX2) chosen at run time and a
//!   portable fallback that produces the same bytes.
//! - [`gf`]: the field arithmetic both rest on.
//! - [`io`]: the group's reads, writes, reconstruction, scrub and repair
//!   through its children's queues (the only part that does I/O).
//!
//! The vdev layer uses them like this. Write: `map = geometry.map(offset, size)`,
//! `generate_parity(parity buffers, map.split_data(buffer))`, then one write per
//! column (with `appended_skip_bytes` of zeros after it) and one optional write
//! per [`SkipWrite::Optional`] skip sector. Read: read the data columns; on an
//! error or checksum mismatch read the rest and call [`reconstruct`] with the
//! columns believed bad, trying combinations until the checksum matches.

pub mod geometry;
pub mod gf;
pub mod io;
mod kernels;
pub mod parity;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use geometry::{Column, GeometryError, RaidzGeometry, RaidzMap, SkipSector, SkipWrite};
pub use io::PrecomputedParity;
pub use kernels::ParityImplementation;
pub use parity::{
    generate_parity, generate_parity_with, mismatched_parity_columns, reconstruct,
    reconstruct_with, ParityError, DATA_COLUMN_COUNT_MAX, PARITY_COUNT_MAX,
};
