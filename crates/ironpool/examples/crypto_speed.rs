//! Measures sealing and opening of blocks (AES-256-GCM and AES-128-GCM,
//! through the pool's `crypto` module) against memory bandwidth (a memcpy
//! of the same bytes), on 16 KiB and 1 MiB blocks: what an encrypted
//! dataset's data path pays per byte, and which way of opening is cheapest
//! (in place, or from the stored bytes into another buffer).
//! `cargo run --release -p ironpool --example crypto_speed`

use std::time::Instant;

use ironpool::crypto::{DatasetKey, MasterKey, Suite};

fn speed(total_bytes: usize, mut run: impl FnMut()) -> f64 {
    let started = Instant::now();
    run();
    total_bytes as f64 / started.elapsed().as_secs_f64() / 1e9
}

fn main() {
    let total_bytes: usize = 2 << 30;
    let aad = [7u8; 27];
    for block_bytes in [16 << 10, 1 << 20] {
        let block: Vec<u8> = (0..block_bytes)
            .map(|index| ((index * 2654435761usize) >> 13) as u8)
            .collect();
        let rounds = total_bytes / block_bytes;
        let mut copy = vec![0u8; block_bytes];
        let memcpy = speed(total_bytes, || {
            for round in 0..rounds {
                copy.copy_from_slice(&block);
                copy[round % block_bytes] ^= 1;
                std::hint::black_box(&copy);
            }
        });
        println!(
            "block {:>4} KiB: memcpy {memcpy:6.1} GB/s",
            block_bytes >> 10
        );
        for suite in [Suite::Aes256Gcm, Suite::Aes128Gcm] {
            let key = DatasetKey::new(MasterKey::generate(suite).expect("a key"));
            let mut sealed_bytes = vec![0u8; block_bytes];
            let mut sealed = None;
            let seal = speed(total_bytes, || {
                for _ in 0..rounds {
                    sealed = Some(
                        key.seal_into(&aad, &block, &mut sealed_bytes)
                            .expect("sealed"),
                    );
                }
            });
            let sealed = sealed.expect("sealed once");
            let mut opened = vec![0u8; block_bytes];
            let open_into = speed(total_bytes, || {
                for _ in 0..rounds {
                    key.open_into(&sealed, &aad, &sealed_bytes, &mut opened)
                        .expect("opened");
                }
            });
            assert!(opened == block);
            let copy_then_open = speed(total_bytes, || {
                for _ in 0..rounds {
                    opened.copy_from_slice(&sealed_bytes);
                    key.open(&sealed, &aad, &mut opened).expect("opened");
                }
            });
            assert!(opened == block);
            println!(
                "  {:<12} seal_into {seal:5.1} GB/s, open_into {open_into:5.1} GB/s, copy + open in place {copy_then_open:5.1} GB/s",
                suite.name()
            );
        }
    }
}
