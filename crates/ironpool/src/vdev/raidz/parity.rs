//! RAID-Z parity: generation, reconstruction of erased columns, and checking.
//!
//! The math (as OpenZFS's vdev_raidz.c defines it, so blocks are interchangeable
//! in format): over GF(2^8) with polynomial 0x11d, for data columns
//! `D_0 .. D_(n-1)` in map order (the first data column after the parity columns
//! is `D_0`),
//!
//! ```text
//! P = D_0 + D_1 + .. + D_(n-1)                          (XOR)
//! Q = 2^(n-1) D_0 + 2^(n-2) D_1 + .. + 2^0 D_(n-1)      = ((D_0 * 2 + D_1) * 2 + ..) * 2 + D_(n-1)
//! R = 4^(n-1) D_0 + 4^(n-2) D_1 + .. + 4^0 D_(n-1)
//! ```
//!
//! byte by byte. Parity columns are as long as the longest (first) data column;
//! shorter data columns count as zero past their end. Parity row `g` (P = 0,
//! Q = 1, R = 2) therefore gives data column `i` the coefficient
//! `2^(g * (n-1-i))`.
//!
//! Reconstruction of `k <= parity` erased data columns picks `k` surviving parity
//! rows, computes their syndromes (stored parity XOR the parity of the surviving
//! data with the erased columns as zero), which equal `A * D_erased` for the
//! `k x k` matrix `A[a][b] = 2^(g_a * (n-1-e_b))`, and solves with `A^-1`. `A`
//! is always invertible while `n <= 255`: with P and Q (or P and R, or Q and R)
//! its determinant is a sum of two distinct powers of 2, and with all three it
//! is a Vandermonde matrix in the distinct values `2^(n-1-e_b)`. Erased parity
//! columns are then regenerated from the complete data.

use super::gf;
use super::kernels::{self, ParityImplementation, Term, ROW_COUNT_MAX};

/// Most parity columns: RAID-Z3. The three generators 1, 2 and 4 are the only
/// ones for which every erasure pattern stays solvable with this construction
/// (OpenZFS's note on Plank's method).
pub const PARITY_COUNT_MAX: usize = ROW_COUNT_MAX;

/// Most data columns: 255 children (the format's limit) minus one parity. The
/// coefficients `2^i` of Q are distinct only for `i < 255`.
pub const DATA_COLUMN_COUNT_MAX: usize = 254;

/// Input that cannot be parity columns of one RAID-Z block.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParityError {
    #[error("{count} parity columns: RAID-Z has 1 to {PARITY_COUNT_MAX}")]
    ParityCountOutOfRange { count: usize },
    #[error("{count} data columns: a block has 1 to {DATA_COLUMN_COUNT_MAX}")]
    DataColumnCountOutOfRange { count: usize },
    #[error("parity column {index} is {length_bytes} bytes, parity column 0 is {expected_bytes}")]
    ParityLengthMismatch {
        index: usize,
        length_bytes: usize,
        expected_bytes: usize,
    },
    #[error(
        "data column {index} is {length_bytes} bytes, longer than the parity's {parity_bytes}"
    )]
    DataColumnTooLong {
        index: usize,
        length_bytes: usize,
        parity_bytes: usize,
    },
    #[error(
        "{count} columns missing: {parity_count} parity columns rebuild at most {parity_count}"
    )]
    TooManyMissing { count: usize, parity_count: usize },
    #[error("missing column {index} does not exist (the block has {column_count} columns)")]
    MissingColumnOutOfRange { index: usize, column_count: usize },
    #[error("missing column {index} is listed twice")]
    MissingColumnRepeated { index: usize },
    #[error("parity implementation {name} is not available on this CPU")]
    ImplementationUnavailable { name: &'static str },
}

/// Computes the parity columns (1, 2 or 3: P, then Q, then R) of `data_columns`
/// with the fastest implementation. Each parity column must be as long as the
/// longest data column; data columns may be shorter (zero-padded).
pub fn generate_parity(
    parity_columns: &mut [&mut [u8]],
    data_columns: &[&[u8]],
) -> Result<(), ParityError> {
    generate_parity_with(
        ParityImplementation::fastest(),
        parity_columns,
        data_columns,
    )
}

/// [`generate_parity`] with a chosen implementation (tests, benchmarks).
pub fn generate_parity_with(
    implementation: ParityImplementation,
    parity_columns: &mut [&mut [u8]],
    data_columns: &[&[u8]],
) -> Result<(), ParityError> {
    check_available(implementation)?;
    let parity_bytes = validate_shape(
        parity_columns.iter().map(|column| column.len()),
        data_columns.iter().map(|column| column.len()),
    )?;
    let mut outputs: [Option<&mut [u8]>; ROW_COUNT_MAX] = [None, None, None];
    for (output, column) in outputs.iter_mut().zip(parity_columns.iter_mut()) {
        *output = Some(&mut **column);
    }
    kernels::generate_rows(implementation, outputs, data_columns, parity_bytes);
    Ok(())
}

/// Rebuilds the columns listed in `missing_columns` from the others, in place.
///
/// `columns` is the whole block in map order: `parity_count` parity columns,
/// then the data columns; the contents of the missing ones are ignored and
/// overwritten. Any combination of up to `parity_count` missing columns (data
/// and/or parity) is rebuilt. Which columns are bad is the caller's knowledge
/// (read errors, or a combination being tried against the block checksum).
pub fn reconstruct(
    columns: &mut [&mut [u8]],
    parity_count: usize,
    missing_columns: &[usize],
) -> Result<(), ParityError> {
    reconstruct_with(
        ParityImplementation::fastest(),
        columns,
        parity_count,
        missing_columns,
    )
}

/// [`reconstruct`] with a chosen implementation (tests, benchmarks).
pub fn reconstruct_with(
    implementation: ParityImplementation,
    columns: &mut [&mut [u8]],
    parity_count: usize,
    missing_columns: &[usize],
) -> Result<(), ParityError> {
    check_available(implementation)?;
    if parity_count == 0 || parity_count > PARITY_COUNT_MAX || parity_count > columns.len() {
        return Err(ParityError::ParityCountOutOfRange {
            count: parity_count,
        });
    }
    let (parity_columns, data_columns) = columns.split_at_mut(parity_count);
    let parity_bytes = validate_shape(
        parity_columns.iter().map(|column| column.len()),
        data_columns.iter().map(|column| column.len()),
    )?;
    validate_missing(
        missing_columns,
        parity_count,
        parity_count + data_columns.len(),
    )?;

    let mut erased_rows = [false; ROW_COUNT_MAX];
    let mut erased_data: Vec<usize> = Vec::with_capacity(PARITY_COUNT_MAX);
    for &index in missing_columns {
        if index < parity_count {
            erased_rows[index] = true;
        } else {
            erased_data.push(index - parity_count);
        }
    }
    erased_data.sort_unstable();
    if !erased_data.is_empty() {
        let rows: Vec<usize> = (0..parity_count)
            .filter(|&row| !erased_rows[row])
            .take(erased_data.len())
            .collect();
        // There are at least as many surviving parity rows as erased data
        // columns: validate_missing bounded the erasures by the parity count.
        assert_eq!(rows.len(), erased_data.len());
        solve_erased_data(
            implementation,
            parity_columns,
            data_columns,
            &rows,
            &erased_data,
            parity_bytes,
        );
    }
    if erased_rows.iter().any(|&erased| erased) {
        let data: Vec<&[u8]> = data_columns.iter().map(|column| &**column).collect();
        let mut outputs: [Option<&mut [u8]>; ROW_COUNT_MAX] = [None, None, None];
        for (row, column) in parity_columns.iter_mut().enumerate() {
            if erased_rows[row] {
                outputs[row] = Some(&mut **column);
            }
        }
        kernels::generate_rows(implementation, outputs, &data, parity_bytes);
    }
    Ok(())
}

/// Which parity columns do not match the data (indices into `parity_columns`):
/// what a scrub checks once the block checksum has vouched for the data.
pub fn mismatched_parity_columns(
    parity_columns: &[&[u8]],
    data_columns: &[&[u8]],
) -> Result<Vec<usize>, ParityError> {
    let implementation = ParityImplementation::fastest();
    let parity_bytes = validate_shape(
        parity_columns.iter().map(|column| column.len()),
        data_columns.iter().map(|column| column.len()),
    )?;
    let mut expected: Vec<Vec<u8>> = parity_columns
        .iter()
        .map(|_| vec![0u8; parity_bytes])
        .collect();
    let mut outputs: [Option<&mut [u8]>; ROW_COUNT_MAX] = [None, None, None];
    for (output, column) in outputs.iter_mut().zip(expected.iter_mut()) {
        *output = Some(column.as_mut_slice());
    }
    kernels::generate_rows(implementation, outputs, data_columns, parity_bytes);
    Ok((0..parity_columns.len())
        .filter(|&row| expected[row] != parity_columns[row])
        .collect())
}

/// Solves for the erased data columns (indices into `data_columns`) from the
/// parity rows `rows` (as many as erased columns), writing them in place.
fn solve_erased_data(
    implementation: ParityImplementation,
    parity_columns: &[&mut [u8]],
    data_columns: &mut [&mut [u8]],
    rows: &[usize],
    erased_data: &[usize],
    parity_bytes: usize,
) {
    let count = erased_data.len();
    let data_count = data_columns.len();
    // Syndromes: stored parity XOR the parity of the data with the erased
    // columns read as zero (empty).
    let mut syndromes: Vec<Vec<u8>> = (0..count).map(|_| vec![0u8; parity_bytes]).collect();
    {
        let surviving: Vec<&[u8]> = data_columns
            .iter()
            .enumerate()
            .map(|(index, column)| {
                if erased_data.contains(&index) {
                    &[][..]
                } else {
                    &**column
                }
            })
            .collect();
        let mut outputs: [Option<&mut [u8]>; ROW_COUNT_MAX] = [None, None, None];
        for (&row, syndrome) in rows.iter().zip(syndromes.iter_mut()) {
            outputs[row] = Some(syndrome.as_mut_slice());
        }
        kernels::generate_rows(implementation, outputs, &surviving, parity_bytes);
    }
    for (&row, syndrome) in rows.iter().zip(syndromes.iter_mut()) {
        kernels::xor_into(syndrome, &parity_columns[row][..]);
    }

    let mut matrix: gf::Matrix = [[0; gf::MATRIX_SIZE_MAX]; gf::MATRIX_SIZE_MAX];
    for (equation, &row) in rows.iter().enumerate() {
        for (unknown, &erased) in erased_data.iter().enumerate() {
            matrix[equation][unknown] = gf::pow2(row * (data_count - 1 - erased));
        }
    }
    // Invertible for every choice of rows and erased columns (module docs);
    // failing here means the arithmetic itself is broken.
    let inverse = gf::invert(&matrix, count).unwrap_or_else(|| {
        panic!(
            "RAID-Z matrix for rows {rows:?}, erased {erased_data:?} of {data_count} is singular"
        )
    });
    for (unknown, &erased) in erased_data.iter().enumerate() {
        let mut terms: [Term<'_>; ROW_COUNT_MAX] = [(&[], 0); ROW_COUNT_MAX];
        for (equation, syndrome) in syndromes.iter().enumerate() {
            terms[equation] = (syndrome.as_slice(), inverse[unknown][equation]);
        }
        // The column's own length: past it the solution is zero anyway.
        kernels::mul_sum_with(implementation, data_columns[erased], &terms[..count]);
    }
}

fn check_available(implementation: ParityImplementation) -> Result<(), ParityError> {
    if implementation.is_available() {
        Ok(())
    } else {
        Err(ParityError::ImplementationUnavailable {
            name: implementation.name(),
        })
    }
}

/// Checks the counts and lengths of one block's columns; returns the parity
/// column length.
fn validate_shape(
    parity_lengths: impl ExactSizeIterator<Item = usize>,
    data_lengths: impl ExactSizeIterator<Item = usize>,
) -> Result<usize, ParityError> {
    let parity_count = parity_lengths.len();
    if parity_count == 0 || parity_count > PARITY_COUNT_MAX {
        return Err(ParityError::ParityCountOutOfRange {
            count: parity_count,
        });
    }
    let data_count = data_lengths.len();
    if data_count == 0 || data_count > DATA_COLUMN_COUNT_MAX {
        return Err(ParityError::DataColumnCountOutOfRange { count: data_count });
    }
    let mut parity_bytes = None;
    for (index, length_bytes) in parity_lengths.enumerate() {
        let expected_bytes = *parity_bytes.get_or_insert(length_bytes);
        if length_bytes != expected_bytes {
            return Err(ParityError::ParityLengthMismatch {
                index,
                length_bytes,
                expected_bytes,
            });
        }
    }
    let parity_bytes = parity_bytes.unwrap_or(0);
    for (index, length_bytes) in data_lengths.enumerate() {
        if length_bytes > parity_bytes {
            return Err(ParityError::DataColumnTooLong {
                index,
                length_bytes,
                parity_bytes,
            });
        }
    }
    Ok(parity_bytes)
}

fn validate_missing(
    missing_columns: &[usize],
    parity_count: usize,
    column_count: usize,
) -> Result<(), ParityError> {
    if missing_columns.len() > parity_count {
        return Err(ParityError::TooManyMissing {
            count: missing_columns.len(),
            parity_count,
        });
    }
    for (position, &index) in missing_columns.iter().enumerate() {
        if index >= column_count {
            return Err(ParityError::MissingColumnOutOfRange {
                index,
                column_count,
            });
        }
        if missing_columns[..position].contains(&index) {
            return Err(ParityError::MissingColumnRepeated { index });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
