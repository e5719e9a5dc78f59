//! `Weights::row` and `Weights::average_row` find a query's weights in any kind of weights, by
//! the shape's dims, as the flat layouts the docs give.

use attn_core::{AttnInput, AttnOptions, AttnShape, Weights, WeightsRequest, sdpa};

/// Batch 2, 3 query heads on one key/value head, 4 queries, 5 keys, head_dim 2.
fn shape() -> AttnShape {
    AttnShape::new(2, 3, 4, 5, 2)
        .with_kv_heads(1)
        .with_value_dim(3)
}

fn weights(request: WeightsRequest) -> Weights {
    let sh = shape();
    let n = |d: [usize; 4]| -> Vec<f32> {
        (0..d.iter().product::<usize>())
            .map(|i| (i as f32 * 0.7).sin())
            .collect()
    };
    let (q, k, v) = (n(sh.q_dims()), n(sh.k_dims()), n(sh.v_dims()));
    let input = AttnInput::new(&q, &k, &v, sh).unwrap();
    let options = AttnOptions {
        weights: request,
        ..AttnOptions::default()
    };
    sdpa(&input, &options).unwrap().weights.unwrap()
}

#[test]
fn rows_are_found_in_every_kind_of_weights() {
    let sh = shape();
    let all = weights(WeightsRequest::All);
    let rows = weights(WeightsRequest::Rows(vec![3, 1]));
    let average = weights(WeightsRequest::HeadAverage);
    for b in 0..sh.batch {
        for i in 0..sh.seq_q {
            let mut mean = vec![0.0f32; sh.seq_kv];
            for h in 0..sh.n_heads {
                let row = all.row(b, h, i).unwrap();
                let flat = ((b * sh.n_heads + h) * sh.seq_q + i) * sh.seq_kv;
                assert_eq!(row, &all.data()[flat..flat + sh.seq_kv]);
                assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
                mean.iter_mut().zip(row).for_each(|(m, w)| *m += w / 3.0);
                // Rows holds queries 3 and 1 only, in that order.
                match i {
                    3 | 1 => assert_eq!(rows.row(b, h, i).unwrap(), row),
                    _ => assert_eq!(rows.row(b, h, i), None),
                }
            }
            let got = average.average_row(b, i).unwrap();
            assert!(got.iter().zip(&mean).all(|(a, m)| (a - m).abs() < 1e-6));
        }
    }
    // Rows in the order asked: query 1 is the second.
    let second = ((sh.n_heads + 2) * 2 + 1) * sh.seq_kv;
    assert_eq!(
        rows.row(1, 2, 1).unwrap(),
        &rows.data()[second..second + sh.seq_kv]
    );
}

#[test]
fn indices_out_of_range_and_other_kinds_give_none() {
    let sh = shape();
    let all = weights(WeightsRequest::All);
    let average = weights(WeightsRequest::HeadAverage);
    for (b, h, i) in [(2, 0, 0), (0, 3, 0), (0, 0, 4), (usize::MAX, 0, 0)] {
        assert_eq!(all.row(b, h, i), None);
    }
    assert_eq!(average.row(0, 0, 0), None);
    assert_eq!(all.average_row(0, 0), None);
    assert_eq!(average.average_row(2, 0), None);
    assert_eq!(average.average_row(0, 4), None);
    // Data that disagrees with its dims (the variants' fields are public).
    let short = |w: &Weights| w.data()[1..].to_vec();
    let bad_all = Weights::All {
        dims: [sh.batch, sh.n_heads, sh.seq_q, sh.seq_kv],
        data: short(&all),
    };
    let bad_average = Weights::HeadAverage {
        dims: [sh.batch, sh.seq_q, sh.seq_kv],
        data: short(&average),
    };
    assert_eq!(bad_all.row(0, 0, 0), None);
    assert_eq!(bad_average.average_row(0, 0), None);
    assert_eq!(all.dims(), [sh.batch, sh.n_heads, sh.seq_q, sh.seq_kv]);
    assert_eq!(average.dims(), [sh.batch, sh.seq_q, sh.seq_kv]);
}
