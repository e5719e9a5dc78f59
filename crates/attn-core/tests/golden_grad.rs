//! The backward pass against every file of `tests/data/grad`: PyTorch's float64 autograd
//! gradients of `sum(out · dout)`, within 1e-4 absolute, through both the fast path (fed the
//! fast forward's `out` and `lse`) and the reference twin.

mod common;

use attn_core::{AttnInput, sdpa, sdpa_backward, sdpa_backward_reference};
use common::{golden_files, load_case};

/// Largest |got − expected| and where it is.
fn max_abs(got: &[f32], expected: &[f32]) -> (f32, usize) {
    assert_eq!(got.len(), expected.len(), "length differs");
    got.iter()
        .zip(expected)
        .map(|(g, e)| {
            if g.is_nan() {
                f32::INFINITY
            } else {
                (g - e).abs()
            }
        })
        .enumerate()
        .fold((0.0, 0), |w, (i, d)| if d > w.0 { (d, i) } else { w })
}

#[test]
fn gradients_match_every_golden_file() {
    let files = golden_files("grad");
    assert_eq!(files.len(), 8, "the README lists 8 gradient files");
    for path in files {
        let case = load_case(&path);
        let input = AttnInput::new(&case.q, &case.k, &case.v, case.shape).unwrap();
        let dout = &case.extra["dout"].f32;
        let fwd = sdpa(&input, &case.options).unwrap();
        let fast = sdpa_backward(&input, &case.options, &fwd, dout).unwrap();
        let reference = sdpa_backward_reference(&input, &case.options, dout).unwrap();
        for (how, grads) in [("fast", &fast), ("reference", &reference)] {
            for (name, got) in [("dq", &grads.dq), ("dk", &grads.dk), ("dv", &grads.dv)] {
                let expected = &case.extra[&format!("expected_{name}")].f32;
                let (d, at) = max_abs(got, expected);
                assert!(
                    d <= 1e-4,
                    "{} ({how}): {name} differs by {d:e} at flat index {at} (got {}, expected {})",
                    case.name,
                    got[at],
                    expected[at]
                );
            }
        }
    }
}
