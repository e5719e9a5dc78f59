//! Every file of `tests/data/mha` (PyTorch `nn.MultiheadAttention`, batch first) through
//! [`MultiheadAttention`]: output and weights within 1e-5 (relative above 1).

mod common;

use attn_core::{
    AttnOptions, BoolMask, KeyPadding, MhaConfig, MhaInput, MultiheadAttention, StateDict, Weights,
    WeightsRequest,
};
use common::{Tensor, assert_close, golden_files, load_tensors};
use serde_json::Value;
use std::collections::HashMap;

fn meta_usize(md: &HashMap<String, Value>, key: &str) -> usize {
    md[key].as_u64().unwrap_or_else(|| panic!("metadata {key}")) as usize
}

/// The module of a golden file: sizes from the metadata, weights from the `state.` tensors.
fn load_module(t: &HashMap<String, Tensor>, md: &HashMap<String, Value>) -> MultiheadAttention {
    let config = MhaConfig::with_kv_dims(
        meta_usize(md, "embed_dim"),
        meta_usize(md, "num_heads"),
        meta_usize(md, "kdim"),
        meta_usize(md, "vdim"),
    )
    .unwrap();
    MultiheadAttention::from_state_dict(config, &state_dict(t)).unwrap()
}

fn state_dict(t: &HashMap<String, Tensor>) -> StateDict {
    t.iter()
        .filter_map(|(k, v)| {
            let k = k.strip_prefix("state.")?;
            Some((k.to_string(), (v.dims.clone(), v.f32.clone())))
        })
        .collect()
}

#[test]
fn every_golden_mha_case_matches_pytorch() {
    let files = golden_files("mha");
    assert_eq!(files.len(), 16, "tests/data/mha should hold 16 cases");
    for path in files {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let (mut t, md) = load_tensors(&path);
        let mha = load_module(&t, &md);

        let (query, key, value) = (
            t.remove("query").unwrap(),
            t.remove("key").unwrap(),
            t.remove("value").unwrap(),
        );
        let input = MhaInput {
            query: &query.f32,
            key: &key.f32,
            value: &value.f32,
            batch: query.dims[0],
            seq_q: query.dims[1],
            seq_kv: key.dims[1],
        };
        let average = md["average_attn_weights"].as_bool().unwrap();
        // The files use PyTorch's MHA convention (true = ignore); ours is true = may attend.
        let mut options = AttnOptions {
            weights: if average {
                WeightsRequest::HeadAverage
            } else {
                WeightsRequest::All
            },
            ..AttnOptions::default()
        };
        if let Some(m) = t.get("attn_mask_ignore") {
            let allowed = m.bool.iter().map(|&ignore| !ignore).collect();
            options.bool_mask = Some(BoolMask::from_vec(allowed, &m.dims).unwrap());
        }
        if let Some(kp) = t.get("key_padding_mask_ignore") {
            let real = kp.bool.iter().map(|&ignore| !ignore).collect();
            options.key_padding = Some(KeyPadding::from_vec(real, kp.dims[0], kp.dims[1]).unwrap());
        }
        let got = mha.forward(&input, &options).unwrap();
        assert_close("out", &name, &got.out, &t["expected_out"].f32, 1e-5);
        let weights = match (got.weights, average) {
            (Some(Weights::HeadAverage { data: w, .. }), true)
            | (Some(Weights::All { data: w, .. }), false) => w,
            (other, _) => panic!("{name}: unexpected weights {other:?}"),
        };
        assert_close("weights", &name, &weights, &t["expected_weights"].f32, 1e-5);
    }
}

#[test]
fn packed_and_separate_projections_agree() {
    // The same module loaded twice: once packed, once with in_proj_weight cut into three.
    let path = common::golden_dir("mha").join("mha0_plain.safetensors");
    let (t, _) = load_tensors(&path);
    let e = 16;
    let config = MhaConfig::new(e, 4).unwrap();
    let packed = state_dict(&t);
    let mut separate = packed.clone();
    let (_, w) = separate.remove("in_proj_weight").unwrap();
    for (i, name) in ["q_proj_weight", "k_proj_weight", "v_proj_weight"]
        .into_iter()
        .enumerate()
    {
        let part = w[i * e * e..(i + 1) * e * e].to_vec();
        separate.insert(name.to_string(), (vec![e, e], part));
    }
    let a = MultiheadAttention::from_state_dict(config, &packed).unwrap();
    let b = MultiheadAttention::from_state_dict(config, &separate).unwrap();
    let x = &t["query"];
    let input = MhaInput::self_attention(&x.f32, x.dims[0], x.dims[1]);
    let options = AttnOptions::default();
    assert_eq!(
        a.forward(&input, &options).unwrap(),
        b.forward(&input, &options).unwrap()
    );
}

#[test]
fn causal_option_and_minus_infinity_mask_equal_the_golden_causal_mask() {
    // The golden causal cases pass triu(ones(L, S), 1) as "ignore": query i sees keys j ≤ i,
    // which is `Causal::TopLeft`, and also a float mask of −∞ above the diagonal.
    let files: Vec<_> = golden_files("mha")
        .into_iter()
        .filter(|p| p.to_string_lossy().contains("causal_avg"))
        .collect();
    assert_eq!(files.len(), 4, "one causal_avg case per module spec");
    for path in files {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let (t, md) = load_tensors(&path);
        let mha = load_module(&t, &md);
        let (query, key, value) = (&t["query"], &t["key"], &t["value"]);
        let input = MhaInput {
            query: &query.f32,
            key: &key.f32,
            value: &value.f32,
            batch: query.dims[0],
            seq_q: query.dims[1],
            seq_kv: key.dims[1],
        };
        let ignore = &t["attn_mask_ignore"];
        let additive = ignore
            .bool
            .iter()
            .map(|&i| if i { f32::NEG_INFINITY } else { 0.0 })
            .collect();
        for options in [
            AttnOptions {
                causal: Some(attn_core::Causal::TopLeft),
                ..AttnOptions::default()
            },
            AttnOptions {
                float_mask: Some(attn_core::FloatMask::from_vec(additive, &ignore.dims).unwrap()),
                ..AttnOptions::default()
            },
        ] {
            let options = AttnOptions {
                weights: WeightsRequest::HeadAverage,
                ..options
            };
            let got = mha.forward(&input, &options).unwrap();
            assert_close("out", &name, &got.out, &t["expected_out"].f32, 1e-5);
            let Some(Weights::HeadAverage { data: w, .. }) = got.weights else {
                panic!("{name}: no averaged weights")
            };
            assert_close("weights", &name, &w, &t["expected_weights"].f32, 1e-5);
        }
    }
}
