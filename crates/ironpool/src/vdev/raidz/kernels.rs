//! The loops that compute parity, written once over a "lanes" abstraction and
//! instantiated for a portable 64-bit SWAR word and for x86 SSSE3 and AVX2
//! registers (`x86.rs`). `parity.rs` holds the public API and validation; this
//! file assumes validated input.
//!
//! Two kernels cover generation and reconstruction:
//! - `generate`: P, Q and/or R of a set of data columns by Horner's rule
//!   (`Q = ((D0 * 2 + D1) * 2 + ..) * 2 + Dn-1`), so the only multiplication is
//!   by 2 (a shift and a conditional XOR) and every column is read once. It works
//!   a chunk (one or two cache lines) at a time across all columns, keeping the
//!   parity accumulators in registers. A short column reads as zeros past its
//!   end (how OpenZFS treats RAID-Z's unequal columns); an erased column is
//!   passed as an empty slice, which makes the result a syndrome.
//! - `mul_sum`: `destination = sum of c_j * source_j` for up to three sources and
//!   arbitrary constants: the last step of reconstruction, where the constants
//!   come from inverting the parity equations. SIMD multiplies by a constant with
//!   two 16-entry nibble tables and byte shuffles (pshufb); the scalar fallback
//!   uses one 256-entry product table per constant.

use super::gf;

/// Vectors per chunk: two AVX2 registers are one 64-byte cache line, and with
/// three parity rows that is six accumulators, which fit in the 16 registers
/// without spilling.
const UNROLL: usize = 2;

/// Largest chunk of any implementation (AVX2: 2 x 32 bytes). Sizes the stack
/// buffer that zero-pads a column ending inside a chunk.
const CHUNK_BYTES_MAX: usize = 64;

/// Parity rows a kernel computes: P, Q, R. Named by position so that the row
/// number `g` is also the power of 2 (`2^g` = 1, 2, 4) that generates the row.
pub(super) const ROW_COUNT_MAX: usize = 3;

/// A register of bytes the kernels work on in parallel.
///
/// # Safety
/// Every method may use instructions of the implementation's CPU feature; the
/// caller must have checked that the CPU has it ([`ParityImplementation::is_available`]).
pub(super) trait Lanes: Copy {
    /// Bytes per register.
    const WIDTH_BYTES: usize;
    /// All zero.
    unsafe fn zero() -> Self;
    /// The first `WIDTH_BYTES` of `bytes` (any alignment). Panics if shorter.
    unsafe fn load(bytes: &[u8]) -> Self;
    /// Writes the register to the first `WIDTH_BYTES` of `bytes`. Panics if shorter.
    unsafe fn store(self, bytes: &mut [u8]);
    /// Field addition.
    unsafe fn xor(self, other: Self) -> Self;
    /// Every byte times 2 in GF(2^8).
    unsafe fn mul2(self) -> Self;
}

/// Lanes that can multiply every byte by a constant with nibble tables.
pub(super) trait ShuffleLanes: Lanes {
    /// A 16-entry table in every 16-byte lane of the register.
    unsafe fn broadcast_table(table: &[u8; 16]) -> Self;
    /// `low[x & 15] ^ high[x >> 4]` for every byte `x`.
    unsafe fn lookup_nibbles(self, low: Self, high: Self) -> Self;
}

/// Which code computes parity. All produce identical bytes (tested); they differ
/// only in speed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ParityImplementation {
    /// Portable: 64-bit SWAR words for generation, product tables for
    /// reconstruction. Always available.
    Scalar,
    /// 16-byte SSSE3 registers (byte shuffles for the table lookups).
    Ssse3,
    /// 32-byte AVX2 registers.
    Avx2,
}

impl ParityImplementation {
    /// Every implementation, slowest first.
    pub const ALL: [ParityImplementation; 3] = [
        ParityImplementation::Scalar,
        ParityImplementation::Ssse3,
        ParityImplementation::Avx2,
    ];

    /// Whether this CPU can run it (feature detection is cached by std, so this
    /// is a load and a test).
    pub fn is_available(self) -> bool {
        match self {
            ParityImplementation::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            ParityImplementation::Ssse3 => std::arch::is_x86_feature_detected!("ssse3"),
            #[cfg(target_arch = "x86_64")]
            ParityImplementation::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The fastest implementation this CPU runs: what the engine uses.
    pub fn fastest() -> ParityImplementation {
        Self::ALL
            .into_iter()
            .rev()
            .find(|implementation| implementation.is_available())
            .unwrap_or(ParityImplementation::Scalar)
    }

    /// Every implementation this CPU runs, slowest first (tests and benchmarks
    /// compare them).
    pub fn all_available() -> Vec<ParityImplementation> {
        Self::ALL
            .into_iter()
            .filter(|implementation| implementation.is_available())
            .collect()
    }

    /// A short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            ParityImplementation::Scalar => "scalar",
            ParityImplementation::Ssse3 => "ssse3",
            ParityImplementation::Avx2 => "avx2",
        }
    }
}

/// A 64-bit word of 8 bytes: the portable implementation of [`Lanes`].
#[derive(Clone, Copy)]
pub(super) struct Swar(u64);

/// The top bit of every byte.
const SWAR_TOP_BITS: u64 = 0x8080_8080_8080_8080;
/// Every bit but the lowest of each byte: what survives a one-bit shift left
/// without crossing into the next byte.
const SWAR_SHIFTED_BITS: u64 = 0xfefe_fefe_fefe_fefe;
/// The reduction byte in every byte.
const SWAR_REDUCTION: u64 = u64::from_ne_bytes([gf::REDUCTION_BYTE; 8]);

impl Lanes for Swar {
    const WIDTH_BYTES: usize = 8;

    unsafe fn zero() -> Self {
        Swar(0)
    }

    unsafe fn load(bytes: &[u8]) -> Self {
        let mut word = [0u8; 8];
        word.copy_from_slice(&bytes[..8]);
        Swar(u64::from_ne_bytes(word))
    }

    unsafe fn store(self, bytes: &mut [u8]) {
        bytes[..8].copy_from_slice(&self.0.to_ne_bytes());
    }

    unsafe fn xor(self, other: Self) -> Self {
        Swar(self.0 ^ other.0)
    }

    unsafe fn mul2(self) -> Self {
        // 0xff in each byte whose top bit is set: (0x80 << 1) - (0x80 >> 7) per
        // byte, computed for all bytes at once (the borrows cancel exactly).
        let top = self.0 & SWAR_TOP_BITS;
        let mask = (top << 1).wrapping_sub(top >> 7);
        Swar(((self.0 << 1) & SWAR_SHIFTED_BITS) ^ (mask & SWAR_REDUCTION))
    }
}

/// Loads one chunk of `column` at `offset`, reading zeros past its end.
///
/// # Safety
/// The CPU supports `V`'s instructions.
#[inline(always)]
unsafe fn load_chunk<V: Lanes>(column: &[u8], offset: usize) -> [V; UNROLL] {
    let chunk_bytes = UNROLL * V::WIDTH_BYTES;
    let mut lanes = [V::zero(); UNROLL];
    if offset + chunk_bytes <= column.len() {
        let chunk = &column[offset..offset + chunk_bytes];
        for (index, lane) in lanes.iter_mut().enumerate() {
            *lane = V::load(&chunk[index * V::WIDTH_BYTES..]);
        }
    } else if offset < column.len() {
        // The column ends inside this chunk: only at a column's end, so rare.
        let mut padded = [0u8; CHUNK_BYTES_MAX];
        let available = column.len() - offset;
        padded[..available].copy_from_slice(&column[offset..]);
        for (index, lane) in lanes.iter_mut().enumerate() {
            *lane = V::load(&padded[index * V::WIDTH_BYTES..]);
        }
    }
    lanes
}

/// Computes parity rows P (if `P`), Q (if `Q`), R (if `R`) of `data` into the
/// matching outputs, each `length` bytes (outputs not computed may be empty).
///
/// # Safety
/// The CPU supports `V`'s instructions.
#[inline(always)]
pub(super) unsafe fn generate<V: Lanes, const P: bool, const Q: bool, const R: bool>(
    p_output: &mut [u8],
    q_output: &mut [u8],
    r_output: &mut [u8],
    data: &[&[u8]],
    length: usize,
) {
    const { assert!(UNROLL * 32 <= CHUNK_BYTES_MAX) };
    let chunk_bytes = UNROLL * V::WIDTH_BYTES;
    let chunked_end = length - length % chunk_bytes;
    let mut offset = 0;
    while offset < chunked_end {
        let mut p = [V::zero(); UNROLL];
        let mut q = [V::zero(); UNROLL];
        let mut r = [V::zero(); UNROLL];
        for column in data {
            let lanes = load_chunk::<V>(column, offset);
            for index in 0..UNROLL {
                if P {
                    p[index] = p[index].xor(lanes[index]);
                }
                if Q {
                    q[index] = q[index].mul2().xor(lanes[index]);
                }
                if R {
                    r[index] = r[index].mul2().mul2().xor(lanes[index]);
                }
            }
        }
        for index in 0..UNROLL {
            let start = offset + index * V::WIDTH_BYTES;
            if P {
                p[index].store(&mut p_output[start..]);
            }
            if Q {
                q[index].store(&mut q_output[start..]);
            }
            if R {
                r[index].store(&mut r_output[start..]);
            }
        }
        offset += chunk_bytes;
    }
    if offset < length {
        generate_bytes::<P, Q, R>(p_output, q_output, r_output, data, offset..length);
    }
}

/// Byte-at-a-time generation for the tail shorter than a chunk.
fn generate_bytes<const P: bool, const Q: bool, const R: bool>(
    p_output: &mut [u8],
    q_output: &mut [u8],
    r_output: &mut [u8],
    data: &[&[u8]],
    range: std::ops::Range<usize>,
) {
    for offset in range {
        let (mut p, mut q, mut r) = (0u8, 0u8, 0u8);
        for column in data {
            let byte = column.get(offset).copied().unwrap_or(0);
            p ^= byte;
            q = gf::mul2(q) ^ byte;
            r = gf::mul2(gf::mul2(r)) ^ byte;
        }
        if P {
            p_output[offset] = p;
        }
        if Q {
            q_output[offset] = q;
        }
        if R {
            r_output[offset] = r;
        }
    }
}

/// A source of `mul_sum`: a column and the constant it is multiplied by.
pub(super) type Term<'a> = (&'a [u8], u8);

/// `destination = sum of coefficient * source` with SIMD nibble-table
/// multiplication; every source is at least as long as `destination`.
///
/// # Safety
/// The CPU supports `V`'s instructions.
#[inline(always)]
pub(super) unsafe fn mul_sum<V: ShuffleLanes>(destination: &mut [u8], terms: &[Term<'_>]) {
    assert!(
        terms.len() <= ROW_COUNT_MAX
            && terms
                .iter()
                .all(|(source, _)| source.len() >= destination.len())
    );
    let mut tables = [(V::zero(), V::zero()); ROW_COUNT_MAX];
    for (table, (_, coefficient)) in tables.iter_mut().zip(terms) {
        let (low, high) = gf::nibble_tables(*coefficient);
        *table = (V::broadcast_table(&low), V::broadcast_table(&high));
    }
    let length = destination.len();
    let chunk_bytes = UNROLL * V::WIDTH_BYTES;
    let chunked_end = length - length % chunk_bytes;
    let mut offset = 0;
    while offset < chunked_end {
        let mut sums = [V::zero(); UNROLL];
        for ((source, _), (low, high)) in terms.iter().zip(tables) {
            let chunk = &source[offset..offset + chunk_bytes];
            for (index, sum) in sums.iter_mut().enumerate() {
                let product = V::load(&chunk[index * V::WIDTH_BYTES..]).lookup_nibbles(low, high);
                *sum = sum.xor(product);
            }
        }
        for (index, sum) in sums.iter().enumerate() {
            sum.store(&mut destination[offset + index * V::WIDTH_BYTES..]);
        }
        offset += chunk_bytes;
    }
    let mut tail_terms: [Term<'_>; ROW_COUNT_MAX] = [(&[], 0); ROW_COUNT_MAX];
    for (tail, (source, coefficient)) in tail_terms.iter_mut().zip(terms) {
        *tail = (&source[offset..], *coefficient);
    }
    mul_sum_scalar(&mut destination[offset..], &tail_terms[..terms.len()]);
}

/// `destination = sum of coefficient * source` with one 256-entry product table
/// per constant: the portable path, and the tail of the SIMD one.
pub(super) fn mul_sum_scalar(destination: &mut [u8], terms: &[Term<'_>]) {
    assert!(
        terms.len() <= ROW_COUNT_MAX
            && terms
                .iter()
                .all(|(source, _)| source.len() >= destination.len())
    );
    if destination.is_empty() {
        return;
    }
    destination.fill(0);
    for (source, coefficient) in terms {
        let table = gf::product_table(*coefficient);
        for (byte, &source_byte) in destination.iter_mut().zip(source.iter()) {
            *byte ^= table[source_byte as usize];
        }
    }
}

/// `destination ^= source` (equal lengths). Plain code: the compiler vectorizes it.
pub(super) fn xor_into(destination: &mut [u8], source: &[u8]) {
    assert_eq!(destination.len(), source.len());
    for (byte, &source_byte) in destination.iter_mut().zip(source) {
        *byte ^= source_byte;
    }
}

/// Selects the monomorphized kernel for the requested rows.
macro_rules! dispatch_rows {
    ($kernel:ident, $rows:expr, $($argument:expr),*) => {
        match $rows {
            [true, false, false] => $kernel::<true, false, false>($($argument),*),
            [false, true, false] => $kernel::<false, true, false>($($argument),*),
            [false, false, true] => $kernel::<false, false, true>($($argument),*),
            [true, true, false] => $kernel::<true, true, false>($($argument),*),
            [true, false, true] => $kernel::<true, false, true>($($argument),*),
            [false, true, true] => $kernel::<false, true, true>($($argument),*),
            [true, true, true] => $kernel::<true, true, true>($($argument),*),
            [false, false, false] => {}
        }
    };
}

/// # Safety
/// None beyond `generate`'s: SWAR needs no CPU feature.
unsafe fn generate_swar<const P: bool, const Q: bool, const R: bool>(
    p: &mut [u8],
    q: &mut [u8],
    r: &mut [u8],
    data: &[&[u8]],
    length: usize,
) {
    // SAFETY: Swar uses only base instructions.
    unsafe { generate::<Swar, P, Q, R>(p, q, r, data, length) }
}

/// Computes the parity rows whose output is present, each `length` bytes, from
/// `data` (short or empty columns read as zeros).
pub(super) fn generate_rows(
    implementation: ParityImplementation,
    outputs: [Option<&mut [u8]>; ROW_COUNT_MAX],
    data: &[&[u8]],
    length: usize,
) {
    assert!(
        implementation.is_available(),
        "{} is not available on this CPU",
        implementation.name()
    );
    assert!(outputs
        .iter()
        .flatten()
        .all(|output| output.len() == length));
    let rows = [
        outputs[0].is_some(),
        outputs[1].is_some(),
        outputs[2].is_some(),
    ];
    let [p, q, r] = outputs;
    let (p, q, r) = (
        p.unwrap_or(&mut []),
        q.unwrap_or(&mut []),
        r.unwrap_or(&mut []),
    );
    match implementation {
        // SAFETY: SWAR needs no CPU feature.
        ParityImplementation::Scalar => unsafe {
            dispatch_rows!(generate_swar, rows, p, q, r, data, length)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: asserted above that the CPU has SSSE3.
        ParityImplementation::Ssse3 => unsafe {
            dispatch_rows!(generate_ssse3, rows, p, q, r, data, length)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: asserted above that the CPU has AVX2.
        ParityImplementation::Avx2 => unsafe {
            dispatch_rows!(generate_avx2, rows, p, q, r, data, length)
        },
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("only the scalar implementation is available off x86_64"),
    }
}

/// `destination = sum of coefficient * source` with the chosen implementation.
pub(super) fn mul_sum_with(
    implementation: ParityImplementation,
    destination: &mut [u8],
    terms: &[Term<'_>],
) {
    assert!(
        implementation.is_available(),
        "{} is not available on this CPU",
        implementation.name()
    );
    match implementation {
        ParityImplementation::Scalar => mul_sum_scalar(destination, terms),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: asserted above that the CPU has SSSE3.
        ParityImplementation::Ssse3 => unsafe { super::x86::mul_sum_ssse3(destination, terms) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: asserted above that the CPU has AVX2.
        ParityImplementation::Avx2 => unsafe { super::x86::mul_sum_avx2(destination, terms) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("only the scalar implementation is available off x86_64"),
    }
}

#[cfg(target_arch = "x86_64")]
use super::x86::{generate_avx2, generate_ssse3};
