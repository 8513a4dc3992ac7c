//! Arithmetic in GF(2^8), the field RAID-Z parity lives in.
//!
//! Addition is XOR. Multiplication is polynomial multiplication modulo the
//! primitive polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11d), the one OpenZFS (and
//! Linux md RAID-6) uses, so 2 generates every non-zero element: each non-zero
//! `a` is `2^log(a)` and `a * b = 2^(log a + log b)`. The tables are built at
//! compile time, so there is no start-up work and nothing to get out of sync.

/// The field's reduction polynomial, x^8 + x^4 + x^3 + x^2 + 1. Fixed by the
/// on-disk format: Q and R parity written by one implementation must be read by
/// any other.
pub const POLYNOMIAL: u16 = 0x11d;

/// Number of non-zero elements; exponents of the generator repeat with this period.
pub const MULTIPLICATIVE_ORDER: usize = 255;

/// The low byte of [`POLYNOMIAL`]: what multiplying by 2 XORs in when the top bit
/// falls off.
pub const REDUCTION_BYTE: u8 = (POLYNOMIAL & 0xff) as u8;

/// Powers of 2, twice over, so `EXP[log a + log b]` needs no modulo.
static EXP: [u8; 2 * MULTIPLICATIVE_ORDER] = build_exp();

/// Discrete logarithms base 2 (`LOG[0]` is unused: 0 has no logarithm).
static LOG: [u8; 256] = build_log();

const fn build_exp() -> [u8; 2 * MULTIPLICATIVE_ORDER] {
    let mut table = [0u8; 2 * MULTIPLICATIVE_ORDER];
    let mut value: u8 = 1;
    let mut index = 0;
    while index < 2 * MULTIPLICATIVE_ORDER {
        table[index] = value;
        value = mul2(value);
        index += 1;
    }
    table
}

const fn build_log() -> [u8; 256] {
    let exp = build_exp();
    let mut table = [0u8; 256];
    let mut exponent = 0;
    while exponent < MULTIPLICATIVE_ORDER {
        table[exp[exponent] as usize] = exponent as u8;
        exponent += 1;
    }
    table
}

/// `value * 2`: a shift, folding the overflowing top bit back in through the
/// polynomial. This is the one step Q parity (Horner's rule) repeats per column.
#[inline(always)]
pub const fn mul2(value: u8) -> u8 {
    let overflow = if value & 0x80 != 0 { REDUCTION_BYTE } else { 0 };
    (value << 1) ^ overflow
}

/// `left * right` in the field.
#[inline]
pub fn mul(left: u8, right: u8) -> u8 {
    if left == 0 || right == 0 {
        return 0;
    }
    EXP[LOG[left as usize] as usize + LOG[right as usize] as usize]
}

/// `2^exponent` (the exponent is taken modulo 255). Parity row `g` gives data
/// column `i` of `n` the coefficient `(2^g)^(n-1-i)`, i.e. `pow2(g * (n-1-i))`.
#[inline]
pub fn pow2(exponent: usize) -> u8 {
    EXP[exponent % MULTIPLICATIVE_ORDER]
}

/// The multiplicative inverse, or None for 0 (which has none).
pub fn inverse(value: u8) -> Option<u8> {
    if value == 0 {
        return None;
    }
    Some(EXP[MULTIPLICATIVE_ORDER - LOG[value as usize] as usize])
}

/// The 256 products `coefficient * x` for every byte `x`: the scalar path
/// multiplies a whole column by one constant with one lookup per byte.
pub fn product_table(coefficient: u8) -> [u8; 256] {
    let mut table = [0u8; 256];
    for (value, product) in table.iter_mut().enumerate() {
        *product = mul(coefficient, value as u8);
    }
    table
}

/// The nibble tables of `coefficient`: products with every low nibble `0..16` and
/// with every high nibble `0x00, 0x10, .., 0xf0`. Multiplication distributes over
/// XOR, so `c * x = low[x & 15] ^ high[x >> 4]`: two 16-entry lookups, which is
/// what one byte shuffle (pshufb) does for 16 or 32 bytes at once.
pub fn nibble_tables(coefficient: u8) -> ([u8; 16], [u8; 16]) {
    let mut low = [0u8; 16];
    let mut high = [0u8; 16];
    for nibble in 0..16u8 {
        low[nibble as usize] = mul(coefficient, nibble);
        high[nibble as usize] = mul(coefficient, nibble << 4);
    }
    (low, high)
}

/// Largest system reconstruction solves: one equation per parity column.
pub const MATRIX_SIZE_MAX: usize = 3;

/// A square matrix of at most [`MATRIX_SIZE_MAX`] rows (the unused part is zero).
pub type Matrix = [[u8; MATRIX_SIZE_MAX]; MATRIX_SIZE_MAX];

/// Inverts the top-left `size` x `size` part of `matrix` by Gauss-Jordan
/// elimination. Returns None when it is singular; for RAID-Z's coefficients it
/// never is (see `parity.rs`), so None means a caller bug.
pub fn invert(matrix: &Matrix, size: usize) -> Option<Matrix> {
    assert!(size <= MATRIX_SIZE_MAX, "matrix of {size} rows");
    let mut work = *matrix;
    let mut result: Matrix = [[0; MATRIX_SIZE_MAX]; MATRIX_SIZE_MAX];
    for (row, result_row) in result.iter_mut().enumerate().take(size) {
        result_row[row] = 1;
    }
    for column in 0..size {
        let pivot_row = (column..size).find(|&row| work[row][column] != 0)?;
        work.swap(column, pivot_row);
        result.swap(column, pivot_row);
        let scale = inverse(work[column][column])?;
        for entry in 0..size {
            work[column][entry] = mul(work[column][entry], scale);
            result[column][entry] = mul(result[column][entry], scale);
        }
        for row in 0..size {
            let factor = work[row][column];
            if row == column || factor == 0 {
                continue;
            }
            for entry in 0..size {
                work[row][entry] ^= mul(factor, work[column][entry]);
                result[row][entry] ^= mul(factor, result[column][entry]);
            }
        }
    }
    Some(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Carry-less multiplication with reduction, bit by bit: the definition.
    fn mul_slow(left: u8, right: u8) -> u8 {
        let mut product: u16 = 0;
        for bit in 0..8 {
            if right & (1 << bit) != 0 {
                product ^= (left as u16) << bit;
            }
        }
        for bit in (8..16).rev() {
            if product & (1 << bit) != 0 {
                product ^= POLYNOMIAL << (bit - 8);
            }
        }
        product as u8
    }

    #[test]
    fn table_multiplication_matches_definition() {
        for left in 0..=255u8 {
            for right in 0..=255u8 {
                assert_eq!(mul(left, right), mul_slow(left, right), "{left} * {right}");
            }
            assert_eq!(mul2(left), mul_slow(left, 2));
        }
    }

    #[test]
    fn two_generates_the_field() {
        let mut seen = [false; 256];
        for exponent in 0..MULTIPLICATIVE_ORDER {
            let value = pow2(exponent);
            assert!(!seen[value as usize], "2^{exponent} repeats");
            seen[value as usize] = true;
        }
        assert!(!seen[0]);
    }

    #[test]
    fn inverses_and_tables() {
        assert_eq!(inverse(0), None);
        for value in 1..=255u8 {
            assert_eq!(mul(value, inverse(value).unwrap()), 1);
            let table = product_table(value);
            let (low, high) = nibble_tables(value);
            for x in 0..=255u8 {
                assert_eq!(table[x as usize], mul(value, x));
                assert_eq!(
                    low[(x & 15) as usize] ^ high[(x >> 4) as usize],
                    mul(value, x)
                );
            }
        }
    }

    #[test]
    fn matrix_inverse_times_matrix_is_identity() {
        let matrix: Matrix = [[1, 1, 1], [4, 2, 1], [16, 4, 1]];
        let inverted = invert(&matrix, 3).unwrap();
        for (row, matrix_row) in matrix.iter().enumerate() {
            for column in 0..3 {
                let product = matrix_row
                    .iter()
                    .zip(&inverted)
                    .fold(0, |sum, (&left, inverted_row)| {
                        sum ^ mul(left, inverted_row[column])
                    });
                assert_eq!(product, u8::from(row == column));
            }
        }
        assert_eq!(invert(&[[1, 1, 0], [1, 1, 0], [0, 0, 0]], 2), None);
    }
}
