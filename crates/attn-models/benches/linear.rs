//! GFLOP/s of the linear layers of all-MiniLM-L6-v2 at the `bench embed` size (800 rows: one
//! thread's half of a 64-sentence batch of 25 tokens), f32 (faer) against bf16x3 (AMX tiles).
//!
//! `cargo bench -p attn-models --bench linear` (one thread; each figure the median of 15 runs,
//! timed in the thread's CPU time so that other processes on the machine disturb it less).

use attn_models::Activation;
use attn_models::checkpoint::F32Data;
use attn_models::ops::{Epilogue, Gemm, GemmKernel, Linear, WeightLayout};
use faer::Par;

fn main() {
    let rows = 800;
    println!(
        "AMX tiles available: {}",
        attn_core::Bf16x3Weight::available()
    );
    for (name, n_in, n_out, epilogue) in [
        ("qkv", 384, 1152, Epilogue::Bias),
        ("attn_out", 384, 384, Epilogue::None),
        (
            "ff_in+gelu",
            384,
            1536,
            Epilogue::BiasActivation(Activation::GeluErf),
        ),
        ("ff_out", 1536, 384, Epilogue::None),
    ] {
        let w: Vec<f32> = (0..n_in * n_out)
            .map(|i| ((i * 7919) % 1000) as f32 / 1e4 - 0.05)
            .collect();
        let bias = vec![0.01; n_out];
        let lin = Linear::new(F32Data::Owned(w), WeightLayout::OutIn, bias, n_in, n_out);
        let x: Vec<f32> = (0..rows * n_in)
            .map(|i| ((i * 104_729) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        let mut y = vec![0.0; rows * n_out];
        let flop = 2.0 * (rows * n_in * n_out) as f64;
        let mut line = format!("{name:>11} [{rows}×{n_in}]·[{n_in}×{n_out}]:");
        for kernel in [GemmKernel::F32, GemmKernel::Bf16x3] {
            let gemm = Gemm {
                par: Par::Seq,
                kernel,
            };
            lin.forward(&x, &mut y, epilogue, gemm);
            let mut times: Vec<f64> = (0..15)
                .map(|_| {
                    let start = thread_cpu_seconds();
                    lin.forward(&x, &mut y, epilogue, gemm);
                    thread_cpu_seconds() - start
                })
                .collect();
            times.sort_by(f64::total_cmp);
            let t = times[times.len() / 2];
            line += &format!(
                "  {kernel:?} {:.1} GFLOP/s ({:.3} ms)",
                flop / t / 1e9,
                t * 1e3
            );
        }
        println!("{line}");
    }
}

/// CPU time of the calling thread.
fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}
