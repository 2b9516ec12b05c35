//! ReLU and its backward pass over slices.
//!
//! Both kernels store every element unconditionally (a select, then a plain
//! store). The obvious form, `if v < 0 { v = 0 }`, vectorises into masked
//! stores (`vmaskmovps`), which AMD cores (Zen 2–4) retire at about one per
//! dozen cycles: on DLRM's MLPs that form cost more than the activations'
//! memory traffic. Semantics are the scalar definition exactly: a negative
//! value becomes zero, everything else (zero, positive, NaN) is kept, with -0 stored as +0; the
//! backward pass zeroes the gradient where the layer's output is not positive.

use super::Scalar;

/// `x ← max(x, 0)` elementwise (NaN is kept, as in `if x < 0 { x = 0 }`).
#[inline]
pub fn relu_in_place<T: Scalar>(x: &mut [T]) {
    for v in x.iter_mut() {
        // `+ 0` makes the kept branch a new value (it only turns -0 into +0), so the
        // compiler cannot turn the select back into a store of the zeros alone.
        let x = *v;
        *v = if x < T::ZERO { T::ZERO } else { x + T::ZERO };
    }
}

/// `grad ← grad · [out > 0]` elementwise, where `out` is the ReLU's output.
#[inline]
pub fn relu_backward_in_place<T: Scalar>(grad: &mut [T], out: &[T]) {
    for (g, &o) in grad.iter_mut().zip(out) {
        // `+ 0` as in `relu_in_place`: every element is stored, no masked stores.
        let x = *g;
        *g = if o <= T::ZERO { T::ZERO } else { x + T::ZERO };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scalar definitions the kernels must equal, element for element.
    fn relu_reference(x: f32) -> f32 {
        if x < 0.0 {
            0.0
        } else {
            x
        }
    }

    #[test]
    fn kernels_equal_the_scalar_definition_on_every_length() {
        let specials = [0.0f32, -0.0, 1e-30, -1e-30, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 3.5, -2.25];
        for len in 0..70 {
            let x: Vec<f32> = (0..len)
                .map(|i| {
                    if i % 5 == 4 {
                        specials[i % specials.len()]
                    } else {
                        tiderec_records::rng::normal_f64(9, 0, i as u64, 0) as f32
                    }
                })
                .collect();
            let mut y = x.clone();
            relu_in_place(&mut y);
            for (a, &b) in y.iter().zip(&x) {
                let expected = relu_reference(b);
                assert!(*a == expected || (a.is_nan() && expected.is_nan()), "relu({b}) = {a}, expected {expected}");
            }
            let g: Vec<f32> = (0..len).map(|i| i as f32 + 0.5).collect();
            let mut dg = g.clone();
            relu_backward_in_place(&mut dg, &y);
            for ((d, &gi), &o) in dg.iter().zip(&g).zip(&y) {
                let expected = if o <= 0.0 { 0.0 } else { gi };
                assert_eq!(*d, expected, "backward at output {o}");
            }
        }
    }
}
