//! `attnscope._native`: the Rust side of the Python package. The Python side
//! (`python/attnscope`) turns torch tensors and broadcast masks into contiguous numpy arrays
//! of 4 dimensions; here they are read in place, the kernels and models run without the GIL,
//! and every error becomes a `ValueError` with the message the command line prints.

use std::path::PathBuf;

use attn_core::{
    AttnElement, AttnInput, AttnOptions, AttnOutput, BoolMask, Causal, Dropout, FloatMask,
    KeyPadding, WeightsRequest, Window, bf16,
};
use attn_models::{GenerateOptions, Sampling};
use attn_viz::explain::{ExplainOptions, Level, Method, explain};
use attn_viz::html::{PageOptions, standalone_page};
use attn_viz::select::Selection;
use attnscope::cmd::attribute::PageMethods;
use half::slice::HalfBitsSliceExt;
use numpy::{IntoPyArray, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

fn value_error(err: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(err.to_string())
}

/// An anyhow error with its causes, as the command line prints it.
fn chain_error(err: anyhow::Error) -> PyErr {
    PyValueError::new_err(format!("{err:#}"))
}

/// q, k and v: float32, or bfloat16 passed as its bits (numpy has no bfloat16).
#[derive(FromPyObject)]
enum Tensor<'py> {
    F32(PyReadonlyArrayDyn<'py, f32>),
    Bf16(PyReadonlyArrayDyn<'py, u16>),
}

/// The options `attnscope.sdpa` gathers, one dict with every key.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
struct Options<'py> {
    scale: Option<f32>,
    /// "top_left" or "bottom_right".
    causal: Option<String>,
    window: Option<(Option<usize>, Option<usize>)>,
    align: Option<String>,
    alibi: Option<Vec<f32>>,
    softcap: Option<f32>,
    /// True: may attend.
    bool_mask: Option<PyReadonlyArrayDyn<'py, bool>>,
    float_mask: Option<PyReadonlyArrayDyn<'py, f32>>,
    /// `[batch, seq_kv]`, True: a real key.
    key_real: Option<PyReadonlyArrayDyn<'py, bool>>,
    dropout_p: f32,
    seed: u64,
    /// None, "all", "head_average", or the query rows.
    weights: Option<Bound<'py, PyAny>>,
    /// The backward pass also gives the float mask's gradient.
    float_mask_grad: bool,
}

fn causal(name: &str, option: &str) -> PyResult<Causal> {
    match name {
        "top_left" => Ok(Causal::TopLeft),
        "bottom_right" => Ok(Causal::BottomRight),
        other => Err(value_error(format!(
            "{option}={other:?}: expected \"top_left\" or \"bottom_right\""
        ))),
    }
}

impl Options<'_> {
    fn attn_options(&self) -> PyResult<AttnOptions> {
        let bool_mask = match &self.bool_mask {
            Some(m) => {
                let data = m.as_slice().map_err(value_error)?.to_vec();
                Some(BoolMask::from_vec(data, m.shape()).map_err(value_error)?)
            }
            None => None,
        };
        let float_mask = match &self.float_mask {
            Some(m) => {
                let data = m.as_slice().map_err(value_error)?.to_vec();
                Some(FloatMask::from_vec(data, m.shape()).map_err(value_error)?)
            }
            None => None,
        };
        let key_padding = match &self.key_real {
            Some(m) => {
                let [batch, seq_kv] = <[usize; 2]>::try_from(m.shape()).map_err(|_| {
                    value_error(format!(
                        "key_padding_mask has shape {:?}; expected [batch, seq_kv]",
                        m.shape()
                    ))
                })?;
                let data = m.as_slice().map_err(value_error)?.to_vec();
                Some(KeyPadding::from_vec(data, batch, seq_kv).map_err(value_error)?)
            }
            None => None,
        };
        let weights = match &self.weights {
            None => WeightsRequest::None,
            Some(w) => match w.extract::<String>() {
                Ok(s) if s == "all" => WeightsRequest::All,
                Ok(s) if s == "head_average" => WeightsRequest::HeadAverage,
                Ok(s) => {
                    return Err(value_error(format!(
                        "return_weights={s:?}: expected \"all\", \"head_average\" or a list of query rows"
                    )));
                }
                Err(_) => WeightsRequest::Rows(w.extract::<Vec<usize>>().map_err(|_| {
                    value_error(
                        "return_weights: expected \"all\", \"head_average\" or a list of query rows (ints from 0)",
                    )
                })?),
            },
        };
        Ok(AttnOptions {
            scale: self.scale,
            softcap: self.softcap,
            alibi: self.alibi.clone(),
            float_mask,
            causal: self
                .causal
                .as_deref()
                .map(|c| causal(c, "causal"))
                .transpose()?,
            window: self.window.map(|(left, right)| Window { left, right }),
            align: self
                .align
                .as_deref()
                .map(|c| causal(c, "align"))
                .transpose()?,
            bool_mask,
            key_padding,
            dropout: (self.dropout_p > 0.0).then_some(Dropout {
                p: self.dropout_p,
                seed: self.seed,
            }),
            weights,
            float_mask_grad: self.float_mask_grad,
            ..AttnOptions::default()
        })
    }
}

fn array<'py>(
    py: Python<'py>,
    values: Vec<f32>,
    dims: &[usize],
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    values.into_pyarray(py).reshape(dims)
}

type Sdpa<'py> = (
    Bound<'py, PyArrayDyn<f32>>,
    Bound<'py, PyArrayDyn<f32>>,
    Option<Bound<'py, PyArrayDyn<f32>>>,
);

type Grads<'py> = (
    Bound<'py, PyArrayDyn<f32>>,
    Bound<'py, PyArrayDyn<f32>>,
    Bound<'py, PyArrayDyn<f32>>,
    Option<Bound<'py, PyArrayDyn<f32>>>,
);

/// The slice behind a contiguous array (the Python side makes them so).
fn contiguous<'a, T: numpy::Element>(
    name: &str,
    a: &'a PyReadonlyArrayDyn<'_, T>,
) -> PyResult<&'a [T]> {
    a.as_slice()
        .map_err(|_| value_error(format!("{name} is not contiguous")))
}

fn run_sdpa<'py, T: AttnElement>(
    py: Python<'py>,
    input: &AttnInput<'_, T>,
    options: &AttnOptions,
) -> PyResult<Sdpa<'py>> {
    let shape = input.shape;
    let out = py
        .detach(|| attn_core::sdpa(input, options))
        .map_err(value_error)?;
    let weights = match out.weights {
        Some(w) => Some(array(py, w.data().to_vec(), w.dims())?),
        None => None,
    };
    Ok((
        array(py, out.out, &shape.out_dims())?,
        array(py, out.lse, &[shape.batch, shape.n_heads, shape.seq_q])?,
        weights,
    ))
}

/// Scaled dot-product attention on `[batch, heads, seq, dim]` arrays: (out, lse, weights).
#[pyfunction]
fn sdpa<'py>(
    py: Python<'py>,
    q: Tensor<'py>,
    k: Tensor<'py>,
    v: Tensor<'py>,
    options: Options<'py>,
) -> PyResult<Sdpa<'py>> {
    let options = options.attn_options()?;
    match (&q, &k, &v) {
        (Tensor::F32(q), Tensor::F32(k), Tensor::F32(v)) => {
            let input = AttnInput::from_dims(
                (contiguous("query", q)?, q.shape()),
                (contiguous("key", k)?, k.shape()),
                (contiguous("value", v)?, v.shape()),
            )
            .map_err(value_error)?;
            run_sdpa(py, &input, &options)
        }
        (Tensor::Bf16(q), Tensor::Bf16(k), Tensor::Bf16(v)) => {
            // bf16 is u16 underneath: the bits are read in place.
            let bits = |name, a| -> PyResult<&[bf16]> {
                Ok(contiguous(name, a)?.reinterpret_cast::<bf16>())
            };
            let input = AttnInput::from_dims(
                (bits("query", q)?, q.shape()),
                (bits("key", k)?, k.shape()),
                (bits("value", v)?, v.shape()),
            )
            .map_err(value_error)?;
            run_sdpa(py, &input, &options)
        }
        _ => Err(value_error(
            "query, key and value must have one dtype: float32 or bfloat16",
        )),
    }
}

/// The gradients of `sdpa` (float32): (dq, dk, dv, the float mask's when asked for, shaped as
/// the mask).
#[allow(clippy::too_many_arguments)]
#[pyfunction]
fn sdpa_backward<'py>(
    py: Python<'py>,
    q: PyReadonlyArrayDyn<'py, f32>,
    k: PyReadonlyArrayDyn<'py, f32>,
    v: PyReadonlyArrayDyn<'py, f32>,
    out: PyReadonlyArrayDyn<'py, f32>,
    lse: PyReadonlyArrayDyn<'py, f32>,
    dout: PyReadonlyArrayDyn<'py, f32>,
    options: Options<'py>,
) -> PyResult<Grads<'py>> {
    let mask_dims = options.float_mask.as_ref().map(|m| m.shape().to_vec());
    let options = options.attn_options()?;
    let input = AttnInput::from_dims(
        (contiguous("query", &q)?, q.shape()),
        (contiguous("key", &k)?, k.shape()),
        (contiguous("value", &v)?, v.shape()),
    )
    .map_err(value_error)?;
    let forward = AttnOutput {
        out: contiguous("out", &out)?.to_vec(),
        lse: contiguous("lse", &lse)?.to_vec(),
        weights: None,
    };
    let dout = contiguous("grad_out", &dout)?;
    let shape = input.shape;
    let grads = py
        .detach(|| attn_core::sdpa_backward(&input, &options, &forward, dout))
        .map_err(value_error)?;
    let dmask = match (grads.dmask, mask_dims) {
        (Some(d), Some(dims)) => Some(array(py, d, &dims)?),
        _ => None,
    };
    Ok((
        array(py, grads.dq, &shape.q_dims())?,
        array(py, grads.dk, &shape.k_dims())?,
        array(py, grads.dv, &shape.v_dims())?,
        dmask,
    ))
}

/// Sizes the thread pool every kernel and model runs on.
#[pyfunction]
fn set_threads(n: usize) -> PyResult<()> {
    attn_models::set_threads(n).map_err(value_error)
}

/// A model: the default all-MiniLM-L6-v2 (fetched on first use, as the command line does), a
/// directory in the Hugging Face layout, or a Hugging Face cache id.
#[pyclass(frozen, module = "attnscope._native")]
struct Model {
    inner: attn_models::Model,
}

#[pymethods]
impl Model {
    #[new]
    #[pyo3(signature = (path_or_id=None))]
    fn new(py: Python<'_>, path_or_id: Option<PathBuf>) -> PyResult<Self> {
        let inner = py
            .detach(|| attnscope::maps::load_model(path_or_id.as_deref(), None))
            .map_err(chain_error)?;
        Ok(Model { inner })
    }

    #[getter]
    fn name(&self) -> String {
        self.inner.name().to_string()
    }

    #[getter]
    fn n_layers(&self) -> usize {
        self.inner.n_layers()
    }

    #[getter]
    fn n_heads(&self) -> usize {
        self.inner.n_heads()
    }

    /// The tokens the model reads for `text` (and `pair`), special tokens included.
    #[pyo3(signature = (text, pair=None))]
    fn tokenize(&self, text: &str, pair: Option<&str>) -> PyResult<Vec<String>> {
        let enc = self.inner.encode(text, pair).map_err(value_error)?;
        Ok(enc.tokens.clone())
    }

    /// Every layer's and head's attention: (tokens, weights `[L, H, T, T]`).
    #[pyo3(signature = (text, pair=None))]
    fn attentions<'py>(
        &self,
        py: Python<'py>,
        text: &str,
        pair: Option<&str>,
    ) -> PyResult<(Vec<String>, Bound<'py, PyArrayDyn<f32>>)> {
        let maps = py
            .detach(|| attnscope::maps::run_model(&self.inner, text, pair, false))
            .map_err(chain_error)?;
        let t = maps.tokens.len();
        let tokens = maps.tokens.iter().map(|t| t.text.clone()).collect();
        let dims = [maps.n_layers, maps.n_heads, t, t];
        Ok((tokens, array(py, maps.weights, &dims)?))
    }

    /// Sentence embeddings `[N, d]` (the model's pooling, normalised as the model says).
    fn embed<'py>(
        &self,
        py: Python<'py>,
        texts: Vec<String>,
    ) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let rows = py.detach(|| self.inner.embed(&refs)).map_err(value_error)?;
        let d = rows.first().map_or(0, Vec::len);
        array(py, rows.concat(), &[texts.len(), d])
    }

    /// The continuation of `prompt`, greedy: (text, generated ids).
    #[pyo3(signature = (prompt, max_new_tokens=20))]
    fn generate(
        &self,
        py: Python<'_>,
        prompt: &str,
        max_new_tokens: usize,
    ) -> PyResult<(String, Vec<u32>)> {
        let options = GenerateOptions {
            max_new_tokens,
            sampling: Sampling::Greedy,
            attention: false,
        };
        let out = py
            .detach(|| attn_models::generate(&self.inner, prompt, &options))
            .map_err(value_error)?;
        Ok((out.text, out.ids))
    }

    /// `attnscope explain --json` as a JSON string.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (text, focus=None, pair=None, layer=None, head=None, rollout=false, tokens=false, special=false, top=None))]
    fn explain(
        &self,
        py: Python<'_>,
        text: &str,
        focus: Option<String>,
        pair: Option<&str>,
        layer: Option<usize>,
        head: Option<usize>,
        rollout: bool,
        tokens: bool,
        special: bool,
        top: Option<usize>,
    ) -> PyResult<String> {
        let selection = Selection::from_flags(layer, head, rollout).map_err(value_error)?;
        let options = ExplainOptions {
            method: Method::Attention { selection },
            level: if tokens { Level::Tokens } else { Level::Words },
            special,
            focus,
            top,
            ..ExplainOptions::default()
        };
        py.detach(|| {
            let maps = attnscope::maps::run_model(&self.inner, text, pair, false)?;
            let explanation = explain(&maps, &options, |_, _| {})?;
            anyhow::Ok(serde_json::to_string(&explanation)?)
        })
        .map_err(chain_error)
    }

    /// The offline explorer page (`attnscope html`) for `text`, as one HTML document.
    #[pyo3(signature = (text, pair=None))]
    fn page(&self, py: Python<'_>, text: &str, pair: Option<&str>) -> PyResult<String> {
        let methods = PageMethods::default();
        py.detach(|| {
            let (maps, qk, measures) =
                attnscope::cmd::html::analyse(&self.inner, (text, pair), false, &methods)?;
            anyhow::Ok(standalone_page(
                &maps,
                Some(&qk),
                &measures,
                &PageOptions::default(),
            )?)
        })
        .map_err(chain_error)
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(sdpa, m)?)?;
    m.add_function(wrap_pyfunction!(sdpa_backward, m)?)?;
    m.add_function(wrap_pyfunction!(set_threads, m)?)?;
    m.add_class::<Model>()?;
    Ok(())
}
