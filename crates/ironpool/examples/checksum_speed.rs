//! Measures the block checksum algorithms against memory bandwidth (a memcpy of
//! the same bytes), on 16 KiB blocks (the default volblocksize) and 128 KiB.
//! `cargo run --release -p ironpool --example checksum_speed`

use std::time::Instant;

use ironpool::format::ChecksumAlgo;

fn main() {
    let total_bytes: usize = 2 << 30;
    for block_bytes in [16 << 10, 128 << 10] {
        let block: Vec<u8> = (0..block_bytes)
            .map(|index| ((index * 2654435761usize) >> 13) as u8)
            .collect();
        let mut copy = vec![0u8; block_bytes];
        let rounds = total_bytes / block_bytes;
        let started = Instant::now();
        for round in 0..rounds {
            copy.copy_from_slice(&block);
            copy[round % block_bytes] ^= 1;
            std::hint::black_box(&copy);
        }
        let memcpy = total_bytes as f64 / started.elapsed().as_secs_f64() / 1e9;
        println!(
            "block {:>3} KiB: memcpy {memcpy:6.1} GB/s",
            block_bytes >> 10
        );
        for algo in [
            ChecksumAlgo::Xxh3,
            ChecksumAlgo::Fletcher4,
            ChecksumAlgo::Blake3,
        ] {
            let started = Instant::now();
            let mut sink = 0u8;
            for _ in 0..rounds {
                sink ^= algo.compute(std::hint::black_box(&block)).0[0];
            }
            std::hint::black_box(sink);
            let speed = total_bytes as f64 / started.elapsed().as_secs_f64() / 1e9;
            println!(
                "                {:<9} {speed:6.1} GB/s ({:.2}x memcpy)",
                algo.name(),
                speed / memcpy
            );
        }
    }
}
