//! The AMX plumbing: detection against `/proc/cpuinfo`, and the packed bf16 GEMM against an f64
//! reference on awkward sizes (none a multiple of a tile, some below one tile, depth 1).

mod common;

use attn_core::AttnError;
use attn_core::amx::{self, PackedB, gemm_bf16};
use attn_core::fused::bf16;

use common::rng::Rng;

/// Values uniform in [-2, 2), rounded to bf16.
fn values(seed: u64, len: usize) -> Vec<bf16> {
    Rng(seed)
        .vec(len, 2.0)
        .into_iter()
        .map(bf16::from_f32)
        .collect()
}

#[test]
#[cfg(target_os = "linux")]
fn detection_agrees_with_cpuinfo() {
    // The kernel lists `amx_tile` and `amx_bf16` among the CPU flags exactly when CPUID reports
    // them and the kernel supports the tile state; the permission request then succeeds.
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap();
    let flags: Vec<&str> = cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let listed = flags.contains(&"amx_tile") && flags.contains(&"amx_bf16");
    assert_eq!(amx::available(), listed);
}

#[test]
#[cfg(not(target_os = "linux"))]
fn no_amx_without_linux_permission() {
    assert!(!amx::available());
}

#[test]
fn gemm_matches_f64_on_awkward_sizes() {
    // Products of two bf16 values are exact in f32, so the only error is the f32 summation of
    // the k products and the initial C: at most (k + 1)·2^-24·(|c₀| + Σ|a·b|) in any order
    // (Higham, "Accuracy and Stability of Numerical Algorithms", eq. 3.5). The values are far
    // from the subnormals AMX flushes.
    let sizes = [
        (1, 1, 1),
        (1, 64, 1),
        (7, 3, 5),
        (17, 33, 15),
        (31, 32, 33),
        (32, 64, 32),
        (33, 65, 47),
        (63, 100, 17),
        (100, 129, 70),
    ];
    for (seed, &(m, k, n)) in sizes.iter().enumerate() {
        let seed = seed as u64 * 3;
        let a = values(seed, m * k);
        let b_rows = values(seed + 1, k * n);
        let c0: Vec<f32> = values(seed + 2, m * n).iter().map(|x| x.to_f32()).collect();
        let b = PackedB::pack(&b_rows, k, n).unwrap();
        assert_eq!((b.k(), b.n()), (k, n));
        // The transposed packing of Bᵀ is the same matrix.
        let bt: Vec<bf16> = (0..n * k).map(|i| b_rows[(i % k) * n + i / k]).collect();
        assert_eq!(PackedB::pack_transposed(&bt, n, k).unwrap(), b);
        let mut c = c0.clone();
        gemm_bf16(&a, m, &b, &mut c).unwrap();
        for i in 0..m {
            for j in 0..n {
                let c0 = f64::from(c0[i * n + j]);
                let (mut want, mut mag) = (c0, c0.abs());
                for p in 0..k {
                    let x =
                        f64::from(a[i * k + p].to_f32()) * f64::from(b_rows[p * n + j].to_f32());
                    want += x;
                    mag += x.abs();
                }
                let err = (f64::from(c[i * n + j]) - want).abs();
                let tol = (k + 1) as f64 * 2f64.powi(-24) * mag;
                assert!(
                    err <= tol,
                    "({m}, {k}, {n}) at ({i}, {j}): got {}, want {want}, error {err:e} > {tol:e}",
                    c[i * n + j]
                );
            }
        }
    }
}

#[test]
fn gemm_rejects_wrong_lengths() {
    let b = PackedB::pack(&values(1, 6), 2, 3).unwrap();
    let a = values(2, 8);
    let mut c = vec![0.0f32; 12];
    assert!(matches!(
        gemm_bf16(&a[..7], 4, &b, &mut c),
        Err(AttnError::LengthMismatch {
            tensor: "a",
            expected: 8,
            got: 7,
            ..
        })
    ));
    assert!(matches!(
        gemm_bf16(&a, 4, &b, &mut c[..11]),
        Err(AttnError::LengthMismatch {
            tensor: "c",
            expected: 12,
            got: 11,
            ..
        })
    ));
    assert!(matches!(
        PackedB::pack(&values(1, 5), 2, 3),
        Err(AttnError::LengthMismatch {
            tensor: "b",
            expected: 6,
            got: 5,
            ..
        })
    ));
    assert!(matches!(
        PackedB::pack_transposed(&values(1, 5), 3, 2),
        Err(AttnError::LengthMismatch {
            tensor: "bt",
            expected: 6,
            got: 5,
            ..
        })
    ));
    assert!(matches!(
        PackedB::pack(&[], usize::MAX, 2),
        Err(AttnError::TooLarge { .. })
    ));
    // Empty products leave C as it was.
    let empty = PackedB::pack(&[], 0, 3).unwrap();
    let mut c = vec![1.5f32; 6];
    gemm_bf16(&[], 2, &empty, &mut c).unwrap();
    assert_eq!(c, vec![1.5; 6]);
}
