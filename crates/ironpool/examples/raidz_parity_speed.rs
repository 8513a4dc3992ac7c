//! Measures RAID-Z parity generation (P, PQ, PQR) and reconstruction against
//! memory bandwidth (a memcpy of the same bytes), on 128 KiB blocks laid out by
//! the real geometry on 6- and 10-wide groups with 4 KiB sectors, for every
//! parity implementation this CPU runs. Throughput counts the block's data bytes.
//! `cargo run --release -p ironpool --example raidz_parity_speed`

use std::time::{Duration, Instant};

use ironpool::vdev::raidz::{
    generate_parity_with, reconstruct_with, ParityImplementation, RaidzGeometry,
};

/// Bytes of one block: the default recordsize.
const BLOCK_BYTES: u64 = 128 << 10;
/// Sector size of the groups (ashift 12).
const ASHIFT: u8 = 12;
/// How long each measurement runs: long enough to be stable, short enough that
/// the whole table takes seconds.
const MEASURE_DURATION: Duration = Duration::from_millis(300);

/// Runs `step` repeatedly for about MEASURE_DURATION and returns GB/s of
/// `bytes_per_step`.
fn measure(bytes_per_step: u64, mut step: impl FnMut()) -> f64 {
    for _ in 0..8 {
        step();
    }
    let started = Instant::now();
    let mut steps = 0u64;
    while started.elapsed() < MEASURE_DURATION {
        for _ in 0..16 {
            step();
        }
        steps += 16;
    }
    (steps * bytes_per_step) as f64 / started.elapsed().as_secs_f64() / 1e9
}

/// One block's columns, laid out as the vdev layer will.
struct Stripe {
    parity: Vec<Vec<u8>>,
    data: Vec<Vec<u8>>,
}

fn stripe(children: u32, parity_count: u32) -> Stripe {
    let geometry = RaidzGeometry::new(children, parity_count, ASHIFT).expect("valid group shape");
    let map = geometry.map(0, BLOCK_BYTES).expect("valid block");
    let block: Vec<u8> = (0..map.data_size_bytes)
        .map(|index| (index.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let data = map
        .split_data(&block)
        .into_iter()
        .map(<[u8]>::to_vec)
        .collect();
    let parity = (0..parity_count)
        .map(|_| vec![0u8; map.parity_column_bytes() as usize])
        .collect();
    Stripe { parity, data }
}

fn main() {
    let implementations = ParityImplementation::all_available();
    println!(
        "RAID-Z parity, {} KiB blocks, 4 KiB sectors; GB/s of block data (higher is better)",
        BLOCK_BYTES >> 10
    );
    print!("{:<8} {:<12} {:>8}", "width", "operation", "memcpy");
    for implementation in &implementations {
        print!(" {:>8}", implementation.name());
    }
    println!();

    let source = vec![0x5au8; BLOCK_BYTES as usize];
    let mut destination = vec![0u8; BLOCK_BYTES as usize];
    let memcpy = measure(BLOCK_BYTES, || {
        destination.copy_from_slice(std::hint::black_box(&source));
        std::hint::black_box(&mut destination);
    });

    for children in [6u32, 10] {
        for parity_count in 1..=3u32 {
            let mut columns = stripe(children, parity_count);
            let operation = ["P", "PQ", "PQR"][parity_count as usize - 1];
            print!(
                "{:<8} {:<12} {:>8.1}",
                format!("{children}-wide"),
                format!("generate {operation}"),
                memcpy
            );
            for &implementation in &implementations {
                let speed = measure(BLOCK_BYTES, || {
                    let mut parity: Vec<&mut [u8]> =
                        columns.parity.iter_mut().map(Vec::as_mut_slice).collect();
                    let data: Vec<&[u8]> = columns.data.iter().map(Vec::as_slice).collect();
                    generate_parity_with(implementation, &mut parity, std::hint::black_box(&data))
                        .expect("valid columns");
                });
                print!(" {speed:>8.1}");
            }
            println!();

            // Worst case: as many data columns lost as there is parity.
            let missing: Vec<usize> = (parity_count as usize..2 * parity_count as usize).collect();
            print!(
                "{:<8} {:<12} {:>8.1}",
                "",
                format!("rebuild {}D", parity_count),
                memcpy
            );
            for &implementation in &implementations {
                let speed = measure(BLOCK_BYTES, || {
                    let mut all: Vec<&mut [u8]> = columns
                        .parity
                        .iter_mut()
                        .chain(columns.data.iter_mut())
                        .map(Vec::as_mut_slice)
                        .collect();
                    reconstruct_with(
                        implementation,
                        std::hint::black_box(&mut all),
                        parity_count as usize,
                        &missing,
                    )
                    .expect("rebuildable");
                });
                print!(" {speed:>8.1}");
            }
            println!();
        }
    }
}
