//! Measures what compressing one 128 KiB block costs (the default
//! recordsize), on data that does not compress (random bytes), on data only
//! an entropy coder shrinks (random 4-bit values) and on text: lz4, zstd at
//! levels 3 to 19 as `compress` runs them (with the early abort of
//! `ZSTD_EARLY_ABORT_LEVEL_MIN` and up), and zstd at the same levels alone
//! (what every block cost before the early abort).
//! `cargo run --release -p ironpool --example compress_speed`

use std::time::Instant;

use ironpool::block::compress::{compress, CompressionSetting};

const BLOCK_BYTES: usize = 128 << 10;
const ROUNDS: usize = 200;

fn main() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let random: Vec<u8> = (0..BLOCK_BYTES)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    let nibbles: Vec<u8> = random.iter().map(|byte| byte & 0x0f).collect();
    let text: Vec<u8> = b"the quick brown fox jumps over the lazy dog 0123456789 "
        .iter()
        .copied()
        .cycle()
        .take(BLOCK_BYTES)
        .collect();
    for (name, data) in [("random", &random), ("4-bit", &nibbles), ("text", &text)] {
        for setting in ["lz4", "zstd-3", "zstd-4", "zstd-9", "zstd-12", "zstd-19"] {
            let parsed = CompressionSetting::parse(setting).expect("a setting");
            let started = Instant::now();
            let mut stored = 0;
            for _ in 0..ROUNDS {
                stored = compress(parsed, std::hint::black_box(data), 4096)
                    .map_or(BLOCK_BYTES, |(bytes, _)| bytes.len());
            }
            let with_abort = started.elapsed().as_secs_f64() * 1e6 / ROUNDS as f64;
            let alone = if parsed.level > 0 {
                let started = Instant::now();
                let mut out = vec![0u8; BLOCK_BYTES - BLOCK_BYTES / 8];
                for _ in 0..ROUNDS {
                    // A context per block, as `compress` makes one.
                    let mut compressor = zstd::bulk::Compressor::new(parsed.level).expect("zstd");
                    let _ = compressor.compress_to_buffer(std::hint::black_box(data), &mut out);
                }
                format!(
                    "{:8.1} us",
                    started.elapsed().as_secs_f64() * 1e6 / ROUNDS as f64
                )
            } else {
                "       -".to_string()
            };
            println!(
                "{name:>6} {setting:>7}: compress {with_abort:8.1} us per block (stored {:>3} KiB), the compressor alone {alone}",
                stored >> 10
            );
        }
    }
}
