//! x86_64 SIMD lanes for the parity kernels: SSSE3 (16 bytes) and AVX2 (32 bytes).
//!
//! Multiplying by 2 is an add (a shift left within each byte) plus XOR of 0x1d
//! into the bytes whose top bit was set, found with a signed compare against
//! zero. Multiplying by an arbitrary constant is two byte shuffles (pshufb) into
//! 16-entry tables of the constant's products with each nibble value.
//!
//! The lane methods are `#[inline(always)]` without `target_feature`; they are
//! only called from the `#[target_feature]` entry points below, into which they
//! inline, so the intrinsics compile to the feature's instructions there.

use std::arch::x86_64::{
    __m128i, __m256i, _mm256_add_epi8, _mm256_and_si256, _mm256_broadcastsi128_si256,
    _mm256_cmpgt_epi8, _mm256_loadu_si256, _mm256_set1_epi8, _mm256_setzero_si256,
    _mm256_shuffle_epi8, _mm256_srli_epi16, _mm256_storeu_si256, _mm256_xor_si256, _mm_add_epi8,
    _mm_and_si128, _mm_cmpgt_epi8, _mm_loadu_si128, _mm_set1_epi8, _mm_setzero_si128,
    _mm_shuffle_epi8, _mm_srli_epi16, _mm_storeu_si128, _mm_xor_si128,
};

use super::gf;
use super::kernels::{generate, mul_sum, Lanes, ShuffleLanes, Term};

/// The reduction byte as the signed value the set1 intrinsics take.
const REDUCTION_I8: i8 = gf::REDUCTION_BYTE as i8;
/// Keeps the low nibble of each byte.
const NIBBLE_MASK_I8: i8 = 0x0f;

/// One SSSE3 register of 16 bytes.
#[derive(Clone, Copy)]
pub(super) struct Ssse3(__m128i);

impl Lanes for Ssse3 {
    const WIDTH_BYTES: usize = 16;

    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: SSE2 is part of the x86_64 baseline.
        Ssse3(unsafe { _mm_setzero_si128() })
    }

    #[inline(always)]
    unsafe fn load(bytes: &[u8]) -> Self {
        assert!(bytes.len() >= Self::WIDTH_BYTES);
        // SAFETY: the assert keeps the 16-byte read inside `bytes`; loadu takes
        // any alignment.
        Ssse3(unsafe { _mm_loadu_si128(bytes.as_ptr().cast::<__m128i>()) })
    }

    #[inline(always)]
    unsafe fn store(self, bytes: &mut [u8]) {
        assert!(bytes.len() >= Self::WIDTH_BYTES);
        // SAFETY: the assert keeps the 16-byte write inside `bytes`, which we
        // borrow mutably; storeu takes any alignment.
        unsafe { _mm_storeu_si128(bytes.as_mut_ptr().cast::<__m128i>(), self.0) }
    }

    #[inline(always)]
    unsafe fn xor(self, other: Self) -> Self {
        // SAFETY: SSE2 is part of the x86_64 baseline.
        Ssse3(unsafe { _mm_xor_si128(self.0, other.0) })
    }

    #[inline(always)]
    unsafe fn mul2(self) -> Self {
        // SAFETY: SSE2 is part of the x86_64 baseline; register-only operations.
        unsafe {
            let overflowing = _mm_cmpgt_epi8(_mm_setzero_si128(), self.0);
            let reduction = _mm_and_si128(overflowing, _mm_set1_epi8(REDUCTION_I8));
            Ssse3(_mm_xor_si128(_mm_add_epi8(self.0, self.0), reduction))
        }
    }
}

impl ShuffleLanes for Ssse3 {
    #[inline(always)]
    unsafe fn broadcast_table(table: &[u8; 16]) -> Self {
        // SAFETY: reads exactly the 16 bytes of `table`.
        Ssse3(unsafe { _mm_loadu_si128(table.as_ptr().cast::<__m128i>()) })
    }

    #[inline(always)]
    unsafe fn lookup_nibbles(self, low: Self, high: Self) -> Self {
        // SAFETY: register-only operations; the caller runs us with SSSE3
        // enabled (the shuffle), as the trait requires.
        unsafe {
            let mask = _mm_set1_epi8(NIBBLE_MASK_I8);
            let low_nibbles = _mm_and_si128(self.0, mask);
            let high_nibbles = _mm_and_si128(_mm_srli_epi16(self.0, 4), mask);
            Ssse3(_mm_xor_si128(
                _mm_shuffle_epi8(low.0, low_nibbles),
                _mm_shuffle_epi8(high.0, high_nibbles),
            ))
        }
    }
}

/// One AVX2 register of 32 bytes.
#[derive(Clone, Copy)]
pub(super) struct Avx2(__m256i);

impl Lanes for Avx2 {
    const WIDTH_BYTES: usize = 32;

    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: the caller runs us with AVX2 enabled, as the trait requires.
        Avx2(unsafe { _mm256_setzero_si256() })
    }

    #[inline(always)]
    unsafe fn load(bytes: &[u8]) -> Self {
        assert!(bytes.len() >= Self::WIDTH_BYTES);
        // SAFETY: the assert keeps the 32-byte read inside `bytes`; loadu takes
        // any alignment; AVX2 is enabled by the caller.
        Avx2(unsafe { _mm256_loadu_si256(bytes.as_ptr().cast::<__m256i>()) })
    }

    #[inline(always)]
    unsafe fn store(self, bytes: &mut [u8]) {
        assert!(bytes.len() >= Self::WIDTH_BYTES);
        // SAFETY: the assert keeps the 32-byte write inside `bytes`, which we
        // borrow mutably; storeu takes any alignment; AVX2 is enabled.
        unsafe { _mm256_storeu_si256(bytes.as_mut_ptr().cast::<__m256i>(), self.0) }
    }

    #[inline(always)]
    unsafe fn xor(self, other: Self) -> Self {
        // SAFETY: register-only; AVX2 is enabled by the caller.
        Avx2(unsafe { _mm256_xor_si256(self.0, other.0) })
    }

    #[inline(always)]
    unsafe fn mul2(self) -> Self {
        // SAFETY: register-only; AVX2 is enabled by the caller.
        unsafe {
            let overflowing = _mm256_cmpgt_epi8(_mm256_setzero_si256(), self.0);
            let reduction = _mm256_and_si256(overflowing, _mm256_set1_epi8(REDUCTION_I8));
            Avx2(_mm256_xor_si256(_mm256_add_epi8(self.0, self.0), reduction))
        }
    }
}

impl ShuffleLanes for Avx2 {
    #[inline(always)]
    unsafe fn broadcast_table(table: &[u8; 16]) -> Self {
        // SAFETY: reads exactly the 16 bytes of `table`; AVX2 is enabled by the
        // caller. The AVX2 shuffle looks up within each 16-byte half, so the
        // table goes in both halves.
        Avx2(unsafe {
            _mm256_broadcastsi128_si256(_mm_loadu_si128(table.as_ptr().cast::<__m128i>()))
        })
    }

    #[inline(always)]
    unsafe fn lookup_nibbles(self, low: Self, high: Self) -> Self {
        // SAFETY: register-only; AVX2 is enabled by the caller.
        unsafe {
            let mask = _mm256_set1_epi8(NIBBLE_MASK_I8);
            let low_nibbles = _mm256_and_si256(self.0, mask);
            let high_nibbles = _mm256_and_si256(_mm256_srli_epi16(self.0, 4), mask);
            Avx2(_mm256_xor_si256(
                _mm256_shuffle_epi8(low.0, low_nibbles),
                _mm256_shuffle_epi8(high.0, high_nibbles),
            ))
        }
    }
}

/// Parity generation compiled for SSSE3.
///
/// # Safety
/// The CPU must support SSSE3.
#[target_feature(enable = "ssse3")]
pub(super) unsafe fn generate_ssse3<const P: bool, const Q: bool, const R: bool>(
    p: &mut [u8],
    q: &mut [u8],
    r: &mut [u8],
    data: &[&[u8]],
    length: usize,
) {
    // SAFETY: this function's caller guarantees SSSE3, which is enabled here.
    unsafe { generate::<Ssse3, P, Q, R>(p, q, r, data, length) }
}

/// Parity generation compiled for AVX2.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn generate_avx2<const P: bool, const Q: bool, const R: bool>(
    p: &mut [u8],
    q: &mut [u8],
    r: &mut [u8],
    data: &[&[u8]],
    length: usize,
) {
    // SAFETY: this function's caller guarantees AVX2, which is enabled here.
    unsafe { generate::<Avx2, P, Q, R>(p, q, r, data, length) }
}

/// Constant multiply-and-sum compiled for SSSE3.
///
/// # Safety
/// The CPU must support SSSE3.
#[target_feature(enable = "ssse3")]
pub(super) unsafe fn mul_sum_ssse3(destination: &mut [u8], terms: &[Term<'_>]) {
    // SAFETY: this function's caller guarantees SSSE3, which is enabled here.
    unsafe { mul_sum::<Ssse3>(destination, terms) }
}

/// Constant multiply-and-sum compiled for AVX2.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn mul_sum_avx2(destination: &mut [u8], terms: &[Term<'_>]) {
    // SAFETY: this function's caller guarantees AVX2, which is enabled here.
    unsafe { mul_sum::<Avx2>(destination, terms) }
}
