//! Helpers shared by the integration tests: reading the golden files and reporting differences.

use std::collections::HashMap;
use std::path::PathBuf;

use attn_models::Model;
use safetensors::{Dtype, SafeTensors};

pub fn golden_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data"))
}

/// The seven single-text files of `tests/data/minilm` (`text*.safetensors`), sorted.
#[allow(dead_code)] // for the MiniLM tests, not the task heads'
pub fn minilm_text_files() -> Vec<PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(golden_dir().join("minilm"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("text"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 7);
    files
}

/// One golden file: each tensor as f64 values with its shape, and the JSON-decoded metadata.
pub struct Golden {
    pub tensors: HashMap<String, (Vec<usize>, Vec<f64>)>,
    pub meta: HashMap<String, serde_json::Value>,
}

impl Golden {
    pub fn read(path: &std::path::Path) -> Golden {
        let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let (_, metadata) = SafeTensors::read_metadata(&bytes).unwrap();
        let meta = metadata
            .metadata()
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, serde_json::from_str(&v).unwrap()))
            .collect();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let tensors = st
            .tensors()
            .into_iter()
            .map(|(name, view)| {
                let data = view.data();
                let values: Vec<f64> = match view.dtype() {
                    Dtype::F32 => data
                        .chunks_exact(4)
                        .map(|b| f32::from_le_bytes(b.try_into().unwrap()) as f64)
                        .collect(),
                    Dtype::I64 => data
                        .chunks_exact(8)
                        .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as f64)
                        .collect(),
                    other => panic!("{name}: unexpected dtype {other:?}"),
                };
                (name, (view.shape().to_vec(), values))
            })
            .collect();
        Golden { tensors, meta }
    }

    pub fn tensor(&self, name: &str) -> &(Vec<usize>, Vec<f64>) {
        self.tensors
            .get(name)
            .unwrap_or_else(|| panic!("golden tensor {name} missing"))
    }

    pub fn ids(&self, name: &str) -> Vec<u32> {
        self.tensor(name).1.iter().map(|&v| v as u32).collect()
    }

    #[allow(dead_code)] // for the MiniLM tests, not the task heads'
    pub fn text(&self, key: &str) -> Option<String> {
        self.meta
            .get(key)
            .and_then(|v| v.as_str())
            .map(str::to_string)
    }

    #[allow(dead_code)] // for the tests that read lists of texts, not the gradients'
    pub fn strings(&self, key: &str) -> Vec<String> {
        self.meta[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    }
}

/// Asserts `got` equals `expected` within `tol` absolute, reporting the worst element and its
/// multi-index.
pub fn assert_close(what: &str, got: &[f32], expected: &(Vec<usize>, Vec<f64>), tol: f64) {
    let (shape, want) = expected;
    assert_eq!(
        got.len(),
        want.len(),
        "{what}: {} values, expected {} ({shape:?})",
        got.len(),
        want.len()
    );
    let (worst, at) = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| (g as f64 - w).abs())
        .enumerate()
        .fold((0.0f64, 0usize), |acc, (i, e)| {
            if e > acc.0 || e.is_nan() { (e, i) } else { acc }
        });
    let mut index = vec![0; shape.len()];
    let mut rest = at;
    for (d, &n) in shape.iter().enumerate().rev() {
        index[d] = rest % n;
        rest /= n;
    }
    assert!(
        worst <= tol,
        "{what}: max abs error {worst:.3e} > {tol:e} at {index:?} (got {}, expected {})",
        got[at],
        want[at]
    );
}

/// Cosine similarity of two vectors.
#[allow(dead_code)] // for the MiniLM tests, not the task heads'
pub fn cosine(a: &[f32], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y).sum();
    let na: f64 = a.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|y| y * y).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// One tensor of a checkpoint being edited: name, dtype, shape, little-endian bytes.
pub type RawTensor = (String, Dtype, Vec<usize>, Vec<u8>);

/// An edit of a checkpoint's tensors.
pub type TensorEdit<'a> = &'a dyn Fn(&mut Vec<RawTensor>);

/// Copies the checkpoint directory `src` into `dir` (sub-folders such as `1_Pooling` too), with
/// its `config.json` passed through `edit_config` and, when `edit_tensors` is given, its tensors
/// through it (else `model.safetensors` is copied as it is).
#[allow(dead_code)] // for the tests that build variants of a checkpoint, not the golden ones
pub fn edited_checkpoint(
    src: &std::path::Path,
    dir: &std::path::Path,
    edit_config: impl FnOnce(&mut serde_json::Value),
    edit_tensors: Option<TensorEdit<'_>>,
) {
    copy_dir(src, dir);
    let config_path = dir.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    edit_config(&mut config);
    std::fs::write(&config_path, config.to_string()).unwrap();
    let Some(edit_tensors) = edit_tensors else {
        return;
    };
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<RawTensor> = st
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            (
                name,
                view.dtype(),
                view.shape().to_vec(),
                view.data().to_vec(),
            )
        })
        .collect();
    edit_tensors(&mut tensors);
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(name, dtype, shape, data)| {
            let view = safetensors::tensor::TensorView::new(*dtype, shape.clone(), data).unwrap();
            (name.clone(), view)
        })
        .collect();
    let out = safetensors::serialize(views, None).unwrap();
    std::fs::write(dir.join("model.safetensors"), out).unwrap();
}

fn copy_dir(src: &std::path::Path, dest: &std::path::Path) {
    std::fs::create_dir_all(dest).unwrap();
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        let to = dest.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_dir(&path, &to);
        } else {
            std::fs::copy(&path, &to).unwrap();
        }
    }
}

/// A copy of tiny-gpt2 in `dir` whose first weight of `tensor` is NaN, loaded.
#[allow(dead_code)] // for the error tests (generate.rs, embed_path.rs), not the golden ones
pub fn tiny_gpt2_with_a_nan(dir: &std::path::Path, tensor: &str) -> Model {
    tiny_gpt2_with_a_nan_at(dir, tensor, 0)
}

/// A copy of tiny-gpt2 in `dir` whose weight `at` (a flat index) of `tensor` is NaN, loaded.
#[allow(dead_code)] // for the error tests (generate.rs, embed_path.rs), not the golden ones
pub fn tiny_gpt2_with_a_nan_at(dir: &std::path::Path, tensor: &str, at: usize) -> Model {
    let poison = |tensors: &mut Vec<RawTensor>| {
        let (_, _, _, data) = tensors
            .iter_mut()
            .find(|(name, ..)| name.ends_with(tensor))
            .unwrap();
        data[4 * at..][..4].copy_from_slice(&f32::NAN.to_le_bytes());
    };
    edited_checkpoint(&golden_dir().join("tiny-gpt2"), dir, |_| {}, Some(&poison));
    Model::load(dir).unwrap()
}
