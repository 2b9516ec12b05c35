//! What a packed product does to each entry of `c` beside its sum ([`Finish`]:
//! a forward's bias and ReLU, a backward's ReLU mask and column sums), and the
//! scalar definition of it that kernels without it in registers run around
//! each panel ([`finish_around`]).
//!
//! Invariants: a finish done around a panel and one done in registers give
//! the same values bit for bit (`tests::finish_in_registers_equals_finish_around`);
//! the row is added on a product's first chunk only, the ReLU, the mask and
//! the sums on its last.

use super::{PanelProduct, Scalar};
use std::cell::Cell;

/// What a product does to each entry of `c` beside its sum, as the block is
/// written: a forward's bias and ReLU, a backward's ReLU mask. Kernels that do
/// not do it in registers get it done around them, panel by panel
/// ([`finish_around`]), with the same values.
pub(crate) struct Finish<'a, T> {
    /// Added to every row in place of `c`'s old values: `c[i][j] = Σ + row[j]`
    /// (the bias; addition commutes, so this equals writing the bias into `c`
    /// and accumulating the product onto it).
    pub row: Option<&'a [T]>,
    /// Then `c ← max(c, 0)` as [`relu_in_place`](crate::relu::relu_in_place) does.
    pub relu: bool,
    /// Then `c[i][j] ← c[i][j]·[mask[i·ldc + j] > 0]` as
    /// [`relu_backward_in_place`](crate::relu::relu_backward_in_place) does
    /// (`mask` laid out as `c`: the ReLU's output below a layer's `dx`).
    pub mask: Option<&'a [T]>,
    /// Then each finished row of `c` added to `sums` (`n` values), the rows in
    /// order: from zero, `sums` ends as the column sums of `c` that
    /// `for row in c { sums += row }` computes, bit for bit (a `dx`'s column
    /// sums are the bias gradient of the layer below). The drivers finish the
    /// rows of every column in increasing order, on the last chunk only.
    pub sums: Option<&'a [Cell<T>]>,
}

impl<T> Clone for Finish<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Finish<'_, T> {}

impl<'a, T> Finish<'a, T> {
    /// The plain sum.
    pub const NONE: Self = Finish { row: None, relu: false, mask: None, sums: None };

    /// What the chunk of the reduction from `k0` to `end` (of `k`) does, for
    /// the row group starting at row `g` of `c`: the row on the first chunk,
    /// the ReLU and the mask on the last.
    pub(super) fn of_chunk(self, (k0, end, k): (usize, usize, usize), g: usize, ldc: usize) -> Self {
        let last = end == k;
        Finish {
            row: if k0 == 0 { self.row } else { None },
            relu: last && self.relu,
            mask: if last { self.mask.map(|mask| &mask[g * ldc..]) } else { None },
            sums: if last { self.sums } else { None },
        }
    }
}

/// `finish` done on `rows` rows of `width` columns of `c` (rows `ldc` apart),
/// the block at column `first` of the rows `finish`'s row and mask describe:
/// before the product (`before`: the row copied in, so the product
/// accumulates onto it) or after it (the ReLU, the mask).
pub(super) fn finish_block<T: Scalar>(
    before: bool,
    c: &mut [T],
    (rows, width, ldc): (usize, usize, usize),
    first: usize,
    finish: Finish<'_, T>,
) {
    for r in 0..rows {
        let out = &mut c[r * ldc..r * ldc + width];
        if before {
            if let Some(row) = finish.row {
                out.copy_from_slice(&row[first..first + width]);
            }
            continue;
        }
        if finish.relu {
            crate::relu::relu_in_place(out);
        }
        if let Some(mask) = finish.mask {
            crate::relu::relu_backward_in_place(out, &mask[r * ldc + first..r * ldc + first + width]);
        }
        if let Some(sums) = finish.sums {
            for (sum, &x) in sums[first..first + width].iter().zip(&*out) {
                sum.set(sum.get() + x);
            }
        }
    }
}

/// A panel's product on a kernel that writes plain sums, with `finish` done
/// around it: the row copied into `c` first (then accumulated onto), the ReLU
/// and mask applied to the block after; the panel starts at column `first`.
pub(super) fn finish_around<T: Scalar>(
    mut p: PanelProduct<'_, T>,
    first: usize,
    finish: Finish<'_, T>,
    run: impl FnOnce(PanelProduct<'_, T>),
) {
    let c = std::mem::take(&mut p.c);
    let shape = (p.rows, p.width, p.ldc);
    if finish.row.is_some() {
        finish_block(true, c, shape, first, finish);
        p.accumulate = true;
    }
    run(PanelProduct { c: &mut *c, ..p });
    if finish.relu || finish.mask.is_some() || finish.sums.is_some() {
        finish_block(false, c, shape, first, finish);
    }
}
