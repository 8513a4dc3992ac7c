//! Parity tests: every implementation against a slow model that multiplies bit
//! by bit (no tables), and reconstruction of every erasure combination.

use proptest::prelude::*;

use super::*;
use crate::vdev::raidz::geometry::RaidzGeometry;

/// GF(2^8) multiplication from the definition: carry-less product, reduced by
/// the polynomial. Shares nothing with the table code.
fn mul_slow(left: u8, right: u8) -> u8 {
    let (mut left, mut right, mut product) = (left, right, 0u8);
    while right != 0 {
        if right & 1 != 0 {
            product ^= left;
        }
        let carry = left & 0x80 != 0;
        left <<= 1;
        if carry {
            left ^= 0x1d;
        }
        right >>= 1;
    }
    product
}

/// P, Q, R straight from the formulas: row g gives data column i of n the
/// coefficient (2^g)^(n-1-i); short columns are zero past their end.
fn model_parity(data: &[Vec<u8>], parity_count: usize, length: usize) -> Vec<Vec<u8>> {
    let count = data.len();
    (0..parity_count)
        .map(|row| {
            let generator = [1u8, 2, 4][row];
            let coefficients: Vec<u8> = (0..count)
                .map(|index| {
                    (0..count - 1 - index).fold(1u8, |power, _| mul_slow(power, generator))
                })
                .collect();
            (0..length)
                .map(|offset| {
                    data.iter()
                        .zip(&coefficients)
                        .fold(0u8, |sum, (column, &coefficient)| {
                            sum ^ mul_slow(coefficient, column.get(offset).copied().unwrap_or(0))
                        })
                })
                .collect()
        })
        .collect()
}

/// Deterministic bytes from a seed (xorshift): fast to make, and proptest
/// shrinks the seed and lengths instead of megabytes of data.
fn bytes(seed: u64, length: usize) -> Vec<u8> {
    let mut state = seed | 1;
    (0..length)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

/// A block's data columns: lengths at most `parity_bytes`, some equal to it.
fn make_data(seed: u64, lengths: &[usize]) -> Vec<Vec<u8>> {
    lengths
        .iter()
        .enumerate()
        .map(|(index, &length)| bytes(seed.wrapping_add(index as u64 * 0x9e37_79b9), length))
        .collect()
}

fn generate_all(
    implementation: ParityImplementation,
    data: &[Vec<u8>],
    parity_count: usize,
    parity_bytes: usize,
) -> Vec<Vec<u8>> {
    let mut parity: Vec<Vec<u8>> = (0..parity_count)
        .map(|_| vec![0xa5; parity_bytes])
        .collect();
    let mut parity_slices: Vec<&mut [u8]> = parity
        .iter_mut()
        .map(|column| column.as_mut_slice())
        .collect();
    let data_slices: Vec<&[u8]> = data.iter().map(|column| column.as_slice()).collect();
    generate_parity_with(implementation, &mut parity_slices, &data_slices).unwrap();
    parity
}

/// Every subset of `0..count` with at most `size_max` members.
fn subsets(count: usize, size_max: usize) -> Vec<Vec<usize>> {
    let mut all = vec![vec![]];
    for index in 0..count {
        let extended: Vec<Vec<usize>> = all
            .iter()
            .filter(|subset| subset.len() < size_max)
            .map(|subset| [subset.as_slice(), &[index]].concat())
            .collect();
        all.extend(extended);
    }
    all
}

/// Erases `missing` (fills them with garbage), reconstructs, and checks every
/// column is back.
fn check_reconstruction(
    implementation: ParityImplementation,
    parity: &[Vec<u8>],
    data: &[Vec<u8>],
    missing: &[usize],
) -> Result<(), TestCaseError> {
    let original: Vec<Vec<u8>> = parity.iter().chain(data).cloned().collect();
    let mut columns = original.clone();
    for &index in missing {
        columns[index]
            .iter_mut()
            .for_each(|byte| *byte = byte.wrapping_mul(7).wrapping_add(13));
    }
    let mut slices: Vec<&mut [u8]> = columns
        .iter_mut()
        .map(|column| column.as_mut_slice())
        .collect();
    reconstruct_with(implementation, &mut slices, parity.len(), missing)
        .map_err(|error| TestCaseError::fail(error.to_string()))?;
    for (index, (rebuilt, expected)) in columns.iter().zip(&original).enumerate() {
        prop_assert!(
            rebuilt == expected,
            "{}: column {} wrong after erasing {:?}",
            implementation.name(),
            index,
            missing
        );
    }
    Ok(())
}

/// (parity count, parity bytes, data column lengths, seed).
fn block_strategy(
    data_columns_max: usize,
    parity_bytes_max: usize,
) -> impl Strategy<Value = (usize, usize, Vec<usize>, u64)> {
    (
        1..=PARITY_COUNT_MAX,
        1..=data_columns_max,
        0..=parity_bytes_max,
        any::<u64>(),
    )
        .prop_flat_map(|(parity, count, parity_bytes, seed)| {
            let length = prop_oneof![2 => Just(parity_bytes), 1 => 0..=parity_bytes];
            (
                Just(parity),
                Just(parity_bytes),
                proptest::collection::vec(length, count),
                Just(seed),
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn every_implementation_matches_the_model((parity_count, parity_bytes, lengths, seed) in block_strategy(24, 1100)) {
        let data = make_data(seed, &lengths);
        let expected = model_parity(&data, parity_count, parity_bytes);
        for implementation in ParityImplementation::all_available() {
            let parity = generate_all(implementation, &data, parity_count, parity_bytes);
            prop_assert!(parity == expected, "{} differs from the model", implementation.name());
        }
    }

    #[test]
    fn every_erasure_combination_is_rebuilt((parity_count, parity_bytes, lengths, seed) in block_strategy(9, 700)) {
        let data = make_data(seed, &lengths);
        let parity = generate_all(ParityImplementation::Scalar, &data, parity_count, parity_bytes);
        for missing in subsets(parity_count + data.len(), parity_count) {
            for implementation in ParityImplementation::all_available() {
                check_reconstruction(implementation, &parity, &data, &missing)?;
            }
        }
    }

    #[test]
    fn wide_blocks_are_rebuilt(parity_count in 1..=PARITY_COUNT_MAX, count in 200..=DATA_COLUMN_COUNT_MAX,
        seed in any::<u64>(), picks in proptest::collection::vec(any::<prop::sample::Index>(), 3)) {
        // Exponents near the field's period: coefficients 2^(g*(n-1-i)) wrap.
        let count = count.min(DATA_COLUMN_COUNT_MAX + 1 - parity_count);
        let data = make_data(seed, &vec![96; count]);
        let parity = generate_all(ParityImplementation::fastest(), &data, parity_count, 96);
        prop_assert!(parity == model_parity(&data, parity_count, 96));
        let mut missing: Vec<usize> = picks.iter().map(|pick| pick.index(parity_count + count)).take(parity_count).collect();
        missing.sort_unstable();
        missing.dedup();
        for implementation in ParityImplementation::all_available() {
            check_reconstruction(implementation, &parity, &data, &missing)?;
        }
    }
}

/// Blocks shaped by the real geometry (unequal columns of whole sectors, a
/// single data column, a block smaller than a row), every erasure combination.
#[test]
fn blocks_from_the_geometry_are_rebuilt() {
    for (children, parity_count, sectors) in [
        (6u32, 2u32, 32u64),
        (6, 2, 7),
        (4, 1, 1),
        (5, 3, 2),
        (10, 3, 13),
        (3, 2, 5),
    ] {
        let geometry = RaidzGeometry::new(children, parity_count, 9).unwrap();
        let map = geometry.map(0, sectors * 512).unwrap();
        let block = bytes(
            u64::from(children) * 31 + sectors,
            map.data_size_bytes as usize,
        );
        let data: Vec<Vec<u8>> = map
            .split_data(&block)
            .into_iter()
            .map(<[u8]>::to_vec)
            .collect();
        let parity = generate_all(
            ParityImplementation::fastest(),
            &data,
            parity_count as usize,
            map.parity_column_bytes() as usize,
        );
        assert_eq!(
            parity,
            model_parity(
                &data,
                parity_count as usize,
                map.parity_column_bytes() as usize
            )
        );
        for missing in subsets(map.columns.len(), parity_count as usize) {
            for implementation in ParityImplementation::all_available() {
                check_reconstruction(implementation, &parity, &data, &missing).unwrap();
            }
        }
    }
}

#[test]
fn single_data_column_parity_is_a_copy() {
    let data = vec![bytes(7, 4096)];
    let parity = generate_all(ParityImplementation::fastest(), &data, 3, 4096);
    assert!(parity.iter().all(|column| *column == data[0]));
}

#[test]
fn scrub_finds_the_wrong_parity_column() {
    let data = make_data(99, &[512, 512, 512, 300]);
    let mut parity = generate_all(ParityImplementation::fastest(), &data, 3, 512);
    let data_slices: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let check = |parity: &[Vec<u8>]| {
        mismatched_parity_columns(
            &parity.iter().map(Vec::as_slice).collect::<Vec<_>>(),
            &data_slices,
        )
        .unwrap()
    };
    assert!(check(&parity).is_empty());
    parity[1][200] ^= 0x40;
    assert_eq!(check(&parity), vec![1]);
}

#[test]
fn rejects_malformed_blocks() {
    let data = make_data(1, &[64, 64]);
    let data_slices: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let mut long = [0u8; 64];
    let mut short = [0u8; 32];
    let mut four: Vec<Vec<u8>> = (0..4).map(|_| vec![0u8; 64]).collect();
    let mut four_slices: Vec<&mut [u8]> = four.iter_mut().map(Vec::as_mut_slice).collect();
    assert_eq!(
        generate_parity(&mut four_slices, &data_slices),
        Err(ParityError::ParityCountOutOfRange { count: 4 })
    );
    assert_eq!(
        generate_parity(&mut [], &data_slices),
        Err(ParityError::ParityCountOutOfRange { count: 0 })
    );
    assert_eq!(
        generate_parity(&mut [&mut long[..]], &[]),
        Err(ParityError::DataColumnCountOutOfRange { count: 0 })
    );
    assert_eq!(
        generate_parity(&mut [&mut long[..], &mut short[..]], &data_slices),
        Err(ParityError::ParityLengthMismatch {
            index: 1,
            length_bytes: 32,
            expected_bytes: 64
        })
    );
    assert_eq!(
        generate_parity(&mut [&mut short[..]], &data_slices),
        Err(ParityError::DataColumnTooLong {
            index: 0,
            length_bytes: 64,
            parity_bytes: 32
        })
    );

    let mut columns: Vec<Vec<u8>> = (0..4).map(|_| vec![0u8; 64]).collect();
    let mut slices: Vec<&mut [u8]> = columns.iter_mut().map(Vec::as_mut_slice).collect();
    assert_eq!(
        reconstruct(&mut slices, 1, &[1, 2]),
        Err(ParityError::TooManyMissing {
            count: 2,
            parity_count: 1
        })
    );
    assert_eq!(
        reconstruct(&mut slices, 2, &[4]),
        Err(ParityError::MissingColumnOutOfRange {
            index: 4,
            column_count: 4
        })
    );
    assert_eq!(
        reconstruct(&mut slices, 2, &[3, 3]),
        Err(ParityError::MissingColumnRepeated { index: 3 })
    );
    assert_eq!(
        reconstruct(&mut slices, 0, &[]),
        Err(ParityError::ParityCountOutOfRange { count: 0 })
    );
    assert_eq!(reconstruct(&mut slices, 2, &[0, 3]), Ok(()));
    if !ParityImplementation::Avx2.is_available() {
        assert_eq!(
            generate_parity_with(
                ParityImplementation::Avx2,
                &mut [&mut long[..]],
                &data_slices
            ),
            Err(ParityError::ImplementationUnavailable { name: "avx2" })
        );
    }
}

#[test]
fn reports_which_implementations_run() {
    let available = ParityImplementation::all_available();
    assert_eq!(available[0], ParityImplementation::Scalar);
    assert_eq!(ParityImplementation::fastest(), *available.last().unwrap());
    #[cfg(target_arch = "x86_64")]
    assert_eq!(
        ParityImplementation::Ssse3.is_available(),
        std::arch::is_x86_feature_detected!("ssse3")
    );
}
