//! The reference outputs of `tests/data` with each multiply of the linear layers forced:
//! f32 GEMMs (faer) and bf16x3 on AMX tiles (which falls back to f32 on CPUs without AMX, so
//! there both runs check the f32 path). `golden.rs` runs the default, `GemmKernel::Auto`.

mod common;

use attn_core::Bf16x3Weight;
use attn_models::GemmKernel;
use attn_models::default_model_dir;
use attn_models::{Model, RunOptions};
use common::{Golden, assert_close, cosine, golden_dir, minilm_text_files};

const KERNELS: [GemmKernel; 2] = [GemmKernel::F32, GemmKernel::Bf16x3];

fn all() -> RunOptions {
    RunOptions {
        attentions: true,
        qk: false,
        hidden_states: false,
    }
}

fn minilm(kernel: GemmKernel) -> Model {
    let dir = default_model_dir(false).expect("the default model is cached or can be fetched");
    let mut model = Model::load(&dir).unwrap();
    model.set_gemm_kernel(kernel);
    assert_eq!(model.gemm_kernel(), kernel);
    model
}

#[test]
fn the_forced_kernel_is_the_one_that_runs() {
    // Even one row runs on tiles when bf16x3 is forced and the CPU has AMX; never with f32.
    assert_eq!(GemmKernel::Bf16x3.uses_tiles(1), Bf16x3Weight::available());
    assert!(!GemmKernel::F32.uses_tiles(1 << 20));
    // Auto keeps short inputs (one sentence) on f32.
    assert!(!GemmKernel::Auto.uses_tiles(8));
    assert_eq!(GemmKernel::Auto.uses_tiles(4096), Bf16x3Weight::available());
}

#[test]
fn minilm_texts_match_transformers_with_each_kernel() {
    let files = minilm_text_files();
    for kernel in KERNELS {
        let model = minilm(kernel);
        for path in &files {
            let g = Golden::read(path);
            let name = format!("{kernel:?} {}", path.file_name().unwrap().to_string_lossy());
            let enc = model
                .encode(&g.text("text").unwrap(), g.text("text_pair").as_deref())
                .unwrap();
            assert_eq!(enc.ids, g.ids("input_ids"), "{name}: input_ids");
            let out = model.forward(&enc, &all()).unwrap();
            let attentions = out.attentions.as_ref().unwrap();
            assert_close(
                &format!("{name} attentions"),
                attentions,
                g.tensor("attentions"),
                1e-4,
            );
            assert_close(
                &format!("{name} last_hidden_state"),
                &out.last_hidden_state,
                g.tensor("last_hidden_state"),
                1e-3,
            );
            let cos = cosine(&model.pool(&out).unwrap()[0], &g.tensor("embedding").1);
            assert!(cos >= 0.99999, "{name}: embedding cosine {cos}");
        }
    }
}

#[test]
fn minilm_batch_matches_transformers_with_each_kernel() {
    let g = Golden::read(&golden_dir().join("minilm/batch00.safetensors"));
    let texts: Vec<String> = g.strings("texts");
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    for kernel in KERNELS {
        let model = minilm(kernel);
        let encs: Vec<_> = refs
            .iter()
            .map(|t| model.encode(t, None).unwrap())
            .collect();
        let out = model.forward_batch(&encs, &all()).unwrap();
        assert_close(
            &format!("{kernel:?} batch attentions"),
            out.attentions.as_ref().unwrap(),
            g.tensor("attentions"),
            1e-4,
        );
        assert_close(
            &format!("{kernel:?} batch last_hidden_state"),
            &out.last_hidden_state,
            g.tensor("last_hidden_state"),
            1e-3,
        );
        let (_, want) = g.tensor("embeddings");
        for (b, e) in model.embed(&refs).unwrap().iter().enumerate() {
            let cos = cosine(e, &want[b * e.len()..][..e.len()]);
            assert!(
                cos >= 0.99999,
                "{kernel:?} text {b}: embedding cosine {cos}"
            );
        }
    }
}

#[test]
fn minilm_kernels_agree_on_a_large_batch() {
    // 96 texts of 10‥40 tokens (over 2000 rows: Auto picks tiles where the CPU has them); the
    // two kernels' embeddings agree to the golden tolerance.
    let texts: Vec<String> = (0..96)
        .map(|i| {
            let words = [
                "the", "cat", "sat", "on", "a", "warm", "mat", "near", "door",
            ];
            (0..10 + i % 31)
                .map(|j| words[(i * 7 + j * 3) % words.len()])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let f32 = minilm(GemmKernel::F32).embed(&refs).unwrap();
    for kernel in [GemmKernel::Bf16x3, GemmKernel::Auto] {
        let got = minilm(kernel).embed(&refs).unwrap();
        for (b, (g, w)) in got.iter().zip(&f32).enumerate() {
            let w: Vec<f64> = w.iter().map(|&v| f64::from(v)).collect();
            let cos = cosine(g, &w);
            assert!(cos >= 0.999_999, "{kernel:?} text {b}: cosine {cos} to f32");
        }
    }
}

#[test]
fn tiny_gpt2_matches_transformers_with_each_kernel() {
    let dir = golden_dir().join("tiny-gpt2");
    for kernel in KERNELS {
        let mut model = Model::load(&dir).unwrap();
        model.set_gemm_kernel(kernel);
        for n in 0..2 {
            let g = Golden::read(&dir.join(format!("expected/text{n:02}.safetensors")));
            let enc = model.encode(&g.text("text").unwrap(), None).unwrap();
            let out = model.forward(&enc, &all()).unwrap();
            let name = format!("{kernel:?} text{n}");
            assert_close(
                &format!("{name} attentions"),
                out.attentions.as_ref().unwrap(),
                g.tensor("attentions"),
                1e-3,
            );
            assert_close(
                &format!("{name} last_hidden_state"),
                &out.last_hidden_state,
                g.tensor("last_hidden_state"),
                1e-3,
            );
            assert_close(
                &format!("{name} logits"),
                out.logits.as_ref().unwrap(),
                g.tensor("logits"),
                1e-3,
            );
        }
    }
}
