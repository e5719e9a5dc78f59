//! Every file of `shared/golden/mha` (PyTorch `nn.MultiheadAttention`, batch first) through
//! [`MultiheadAttention`]: output and weights within 1e-5 (relative above 1).

mod common;

use attn_core::{
    AttnOptions, BoolMask, KeyPadding, MhaConfig, MhaInput, MultiheadAttention, StateDict, Weights,
    WeightsRequest,
};
use common::{assert_close, golden_files, load_tensors};

fn meta_usize(md: &std::collections::HashMap<String, serde_json::Value>, key: &str) -> usize {
    md[key].as_u64().unwrap_or_else(|| panic!("metadata {key}")) as usize
}

#[test]
fn every_golden_mha_case_matches_pytorch() {
    let files = golden_files("mha");
    assert_eq!(files.len(), 16, "shared/golden/mha should hold 16 cases");
    for path in files {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let (mut t, md) = load_tensors(&path);
        let config = MhaConfig::with_kv_dims(
            meta_usize(&md, "embed_dim"),
            meta_usize(&md, "num_heads"),
            meta_usize(&md, "kdim"),
            meta_usize(&md, "vdim"),
        )
        .unwrap();
        let state: StateDict = t
            .iter()
            .filter_map(|(k, v)| {
                let k = k.strip_prefix("state.")?;
                Some((k.to_string(), (v.dims.clone(), v.f32.clone())))
            })
            .collect();
        let mha = MultiheadAttention::from_state_dict(config, &state).unwrap();

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
            (Some(Weights::HeadAverage(w)), true) | (Some(Weights::All(w)), false) => w,
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
    let packed: StateDict = t
        .iter()
        .filter_map(|(k, v)| {
            Some((
                k.strip_prefix("state.")?.to_string(),
                (v.dims.clone(), v.f32.clone()),
            ))
        })
        .collect();
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
