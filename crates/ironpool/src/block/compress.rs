//! Block compression: what a volume's `compression` property selects, and the
//! rule for keeping a compressed block.
//!
//! A block is stored compressed only when that saves at least an eighth of its
//! size after rounding to the sector (as OpenZFS does): a smaller saving would
//! cost a decompression on every read for almost no space. Blocks of zeros never
//! get here: they are stored as holes. The work runs on worker threads
//! ([`crate::rt::offload`]) so it never holds up the engine's I/O, but for
//! lz4 of small blocks, which costs less than the handoff (see
//! `INLINE_LZ4_MAX_BYTES` in `pool/data.rs`). Large blocks under a costly
//! zstd level are tried with lz4 and zstd-1 first, and given up when
//! neither shrinks them ([`ZSTD_EARLY_ABORT_LEVEL_MIN`]).

use crate::format::bp::Compression;
use crate::rt::buf::AlignedBuf;
use crate::rt::offload;

/// Highest zstd level accepted (zstd's own maximum without `--ultra`).
pub const ZSTD_LEVEL_MAX: i32 = 19;
/// zstd level when none is given (zstd's default: a good ratio at ~400 MB/s).
pub const ZSTD_LEVEL_DEFAULT: i32 = 3;

/// zstd levels from which a large block is tried with cheaper compressors
/// first (OpenZFS's zstd early abort, 2.2, which starts at level 3): on data
/// that does not compress (media, encrypted or compressed files) every
/// microsecond of zstd is lost. Measured on 128 KiB blocks of random bytes
/// (`examples/compress_speed.rs`, a context per block as `compress` makes):
/// zstd alone costs 20 us at level 3 (as much as the trials, 19 us: its own
/// test for incompressible data is quick there), 31 us at 4 to 8, 42 us at
/// 10, 210 us at 12 and 3-6 ms from 14; with the trials every level costs
/// 18-22 us. Data that compresses pays the lz4 trial, about 6 us a block.
pub const ZSTD_EARLY_ABORT_LEVEL_MIN: i32 = 4;
/// Blocks from this size are tried first (OpenZFS's `zstd_abort_size`): for
/// smaller ones the trials cost about what they could save.
pub const ZSTD_EARLY_ABORT_BYTES_MIN: usize = 128 * 1024;

/// A compression setting: the algorithm and, for zstd, its level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompressionSetting {
    pub algo: Compression,
    pub level: i32,
}

impl CompressionSetting {
    pub const OFF: CompressionSetting = CompressionSetting {
        algo: Compression::Off,
        level: 0,
    };

    /// Parses a property value: off, on (= lz4), lz4, zstd, zstd-1 .. zstd-19.
    pub fn parse(text: &str) -> Option<CompressionSetting> {
        match text {
            "off" => Some(CompressionSetting::OFF),
            "on" | "lz4" => Some(CompressionSetting {
                algo: Compression::Lz4,
                level: 0,
            }),
            "zstd" => Some(CompressionSetting {
                algo: Compression::Zstd,
                level: ZSTD_LEVEL_DEFAULT,
            }),
            _ => {
                let level: i32 = text.strip_prefix("zstd-")?.parse().ok()?;
                (1..=ZSTD_LEVEL_MAX)
                    .contains(&level)
                    .then_some(CompressionSetting {
                        algo: Compression::Zstd,
                        level,
                    })
            }
        }
    }
}

/// Compresses `data` (a whole block). Returns the compressed bytes in a buffer
/// rounded up to `sector_bytes` (zero-filled tail) and the exact compressed
/// length, or None when the block is not worth storing compressed.
pub fn compress(
    setting: CompressionSetting,
    data: &[u8],
    sector_bytes: usize,
) -> Option<(AlignedBuf, usize)> {
    let logical = data.len();
    // At least 1/8 saved, and at least one sector saved once rounded.
    let limit = logical - logical / 8;
    let length;
    let mut out;
    match setting.algo {
        Compression::Off => return None,
        Compression::Lz4 => {
            // lz4 wants room for its worst case; the result is checked below.
            let bound = lz4_flex::block::get_maximum_output_size(logical);
            out = AlignedBuf::zeroed(bound.div_ceil(sector_bytes) * sector_bytes);
            length = lz4_flex::block::compress_into(data, &mut out[..bound]).ok()?;
            out[length..].fill(0);
        }
        Compression::Zstd => {
            if setting.level >= ZSTD_EARLY_ABORT_LEVEL_MIN
                && logical >= ZSTD_EARLY_ABORT_BYTES_MIN
                && !worth_zstd(data, limit)
            {
                return None;
            }
            // zstd stops with an error once the output passes the limit.
            out = AlignedBuf::zeroed(limit.div_ceil(sector_bytes) * sector_bytes);
            length = zstd::bulk::Compressor::new(setting.level)
                .ok()?
                .compress_to_buffer(data, &mut out[..limit])
                .ok()?;
        }
    }
    let rounded = length.div_ceil(sector_bytes) * sector_bytes;
    if length > limit || rounded >= logical {
        return None;
    }
    out.truncate(rounded);
    Some((out, length))
}

/// Whether `data` is worth compressing with zstd at a costly level, told
/// by cheap trials as OpenZFS's early abort does: lz4 first (if it gets
/// under `limit`, zstd will), then zstd-1 (if even that does not, the
/// level asked will not save the eighth either, in all but rare cases).
/// On data that does not compress, the trials cost a fraction of the
/// level asked: see `examples/compress_speed.rs`.
fn worth_zstd(data: &[u8], limit: usize) -> bool {
    let bound = lz4_flex::block::get_maximum_output_size(data.len());
    let mut scratch = vec![0u8; bound];
    if lz4_flex::block::compress_into(data, &mut scratch).is_ok_and(|length| length <= limit) {
        return true;
    }
    zstd::bulk::Compressor::new(1)
        .and_then(|mut compressor| compressor.compress_to_buffer(data, &mut scratch[..limit]))
        .is_ok_and(|length| length <= limit)
}

/// Decompresses a block's physical bytes into its `logical` size.
pub fn decompress(
    algo: Compression,
    physical: &[u8],
    logical: usize,
) -> Result<AlignedBuf, String> {
    let mut out = AlignedBuf::zeroed(logical);
    let written = match algo {
        Compression::Off => return Err("block is not compressed".into()),
        Compression::Lz4 => lz4_flex::block::decompress_into(physical, &mut out)
            .map_err(|error| format!("lz4: {error}"))?,
        Compression::Zstd => zstd::bulk::Decompressor::new()
            .and_then(|mut decompressor| decompressor.decompress_to_buffer(physical, &mut out[..]))
            .map_err(|error| format!("zstd: {error}"))?,
    };
    if written != logical {
        return Err(format!(
            "decompressed to {written} bytes, expected {logical}"
        ));
    }
    Ok(out)
}

/// [`compress`] on a worker thread.
pub async fn compress_offloaded(
    setting: CompressionSetting,
    data: &[u8],
    sector_bytes: usize,
) -> Option<(AlignedBuf, usize)> {
    // SAFETY: `data` is borrowed for the whole await, and the future is awaited
    // here (never leaked); dropping it waits for the worker.
    unsafe {
        offload::run_borrowing(data, move |bytes| {
            compress(setting, bytes.bytes(), sector_bytes)
        })
    }
    .await
}

/// [`decompress`] on a worker thread.
pub async fn decompress_offloaded(
    algo: Compression,
    physical: &[u8],
    logical: usize,
) -> Result<AlignedBuf, String> {
    // SAFETY: as in compress_offloaded.
    unsafe {
        offload::run_borrowing(physical, move |bytes| {
            decompress(algo, bytes.bytes(), logical)
        })
    }
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_block(length: usize) -> Vec<u8> {
        let words = ["pool ", "volume ", "block ", "checksum ", "txg "];
        let mut out = Vec::with_capacity(length);
        let mut index = 0usize;
        while out.len() < length {
            out.extend_from_slice(words[index % words.len()].as_bytes());
            index = index.wrapping_mul(31).wrapping_add(7);
        }
        out.truncate(length);
        out
    }

    fn random_block(length: usize, seed: u64) -> Vec<u8> {
        let mut state = seed | 1;
        (0..length)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect()
    }

    #[test]
    fn parses_settings() {
        assert_eq!(
            CompressionSetting::parse("off"),
            Some(CompressionSetting::OFF)
        );
        assert_eq!(
            CompressionSetting::parse("on").unwrap().algo,
            Compression::Lz4
        );
        assert_eq!(
            CompressionSetting::parse("zstd").unwrap().level,
            ZSTD_LEVEL_DEFAULT
        );
        assert_eq!(CompressionSetting::parse("zstd-19").unwrap().level, 19);
        assert!(CompressionSetting::parse("zstd-0").is_none());
        assert!(CompressionSetting::parse("zstd-20").is_none());
        assert!(CompressionSetting::parse("gzip").is_none());
    }

    #[test]
    fn compressible_blocks_round_trip() {
        for setting in [
            CompressionSetting::parse("lz4").unwrap(),
            CompressionSetting::parse("zstd").unwrap(),
            CompressionSetting::parse("zstd-19").unwrap(),
        ] {
            // A 4 KiB block on 4 KiB sectors can never save a sector.
            assert!(compress(setting, &text_block(4096), 4096).is_none());
            for (length, sector) in [(4096, 512), (16384, 4096), (131072, 4096)] {
                let data = text_block(length);
                let (physical, exact) = compress(setting, &data, sector).expect("text compresses");
                assert_eq!(physical.len() % sector, 0);
                assert!(physical.len() <= length - length / 8);
                let back = decompress(setting.algo, &physical[..exact], length).unwrap();
                assert_eq!(&back[..], &data[..]);
            }
        }
    }

    /// Bytes of 16 values drawn at random: 4 bits of entropy each, which
    /// zstd's entropy coder halves and lz4 (matches only) cannot shrink.
    fn nibble_block(length: usize, seed: u64) -> Vec<u8> {
        random_block(length, seed)
            .into_iter()
            .map(|byte| byte & 0x0f)
            .collect()
    }

    /// zstd's early abort gives up on a large block neither lz4 nor zstd-1
    /// shrinks, and keeps compressing one that only zstd-1 shrinks.
    #[test]
    fn zstd_early_abort_skips_what_does_not_compress_and_keeps_what_does() {
        let random = random_block(ZSTD_EARLY_ABORT_BYTES_MIN, 7);
        let nibbles = nibble_block(ZSTD_EARLY_ABORT_BYTES_MIN, 9);
        let lz4 = CompressionSetting::parse("lz4").unwrap();
        assert!(
            compress(lz4, &nibbles, 4096).is_none(),
            "lz4 must fail here"
        );
        assert!(!worth_zstd(&random, random.len() - random.len() / 8));
        assert!(worth_zstd(&nibbles, nibbles.len() - nibbles.len() / 8));
        for level in [ZSTD_EARLY_ABORT_LEVEL_MIN, 19] {
            let setting = CompressionSetting {
                algo: Compression::Zstd,
                level,
            };
            assert!(compress(setting, &random, 4096).is_none());
            let (physical, exact) = compress(setting, &nibbles, 4096).expect("zstd shrinks it");
            assert!(
                physical.len() <= nibbles.len() * 5 / 8,
                "{}",
                physical.len()
            );
            let back = decompress(Compression::Zstd, &physical[..exact], nibbles.len()).unwrap();
            assert_eq!(&back[..], &nibbles[..]);
        }
    }

    #[test]
    fn incompressible_blocks_stay_uncompressed() {
        for setting in [
            CompressionSetting::parse("lz4").unwrap(),
            CompressionSetting::parse("zstd").unwrap(),
        ] {
            assert!(compress(setting, &random_block(16384, 3), 4096).is_none());
            // A saving below one sector after rounding is no saving.
            let mut mostly_random = random_block(8192, 5);
            mostly_random[..1024].fill(0);
            assert!(compress(setting, &mostly_random, 4096).is_none());
        }
    }

    #[test]
    fn damaged_input_is_an_error_not_a_panic() {
        let data = text_block(16384);
        for algo in [Compression::Lz4, Compression::Zstd] {
            let setting = CompressionSetting { algo, level: 3 };
            let (physical, exact) = compress(setting, &data, 512).unwrap();
            let mut damaged = physical[..exact].to_vec();
            for index in (0..damaged.len()).step_by(7) {
                damaged[index] ^= 0x5a;
            }
            // Either an error or, by chance, wrong bytes of the right size: never a panic.
            if let Ok(back) = decompress(algo, &damaged, 16384) {
                assert_eq!(back.len(), 16384);
            }
            assert!(decompress(algo, &physical[..exact / 2], 16384).is_err());
        }
    }
}
