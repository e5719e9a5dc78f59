//! Real attention maps from `tests/data/minilm` (all-MiniLM-L6-v2, made by Hugging Face
//! transformers), turned into [`AttentionMaps`] without `attn-models`: token spans are recovered
//! by finding each token (less its `##`) in the lowercased text.

use attn_viz::{AttentionMaps, Token};
use safetensors::SafeTensors;

pub const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data");

fn meta(st: &safetensors::tensor::Metadata, key: &str) -> serde_json::Value {
    let raw = &st.metadata().as_ref().expect("metadata")[key];
    serde_json::from_str(raw).expect("metadata value is JSON")
}

fn ints(st: &SafeTensors<'_>, name: &str) -> Vec<i64> {
    let view = st.tensor(name).expect(name);
    view.data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

fn floats(st: &SafeTensors<'_>, name: &str) -> (Vec<f32>, Vec<usize>) {
    let view = st.tensor(name).expect(name);
    let data = view
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    (data, view.shape().to_vec())
}

/// `tests/data/minilm/{name}.safetensors` as attention maps.
pub fn golden_maps(name: &str) -> AttentionMaps {
    let path = format!("{GOLDEN}/minilm/{name}.safetensors");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let (_, header) = SafeTensors::read_metadata(&bytes).expect("header");
    let st = SafeTensors::deserialize(&bytes).expect("safetensors");
    let text = meta(&header, "text").as_str().unwrap().to_string();
    let pair = meta(&header, "text_pair").as_str().map(str::to_string);
    let names: Vec<String> = serde_json::from_value(meta(&header, "tokens")).unwrap();
    let ids = ints(&st, "input_ids");
    let segments = ints(&st, "token_type_ids");
    let (weights, shape) = floats(&st, "attentions");
    let mut cursor = [0usize, 0usize];
    let tokens = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let segment = segments[i] as usize;
            let special = name == "[CLS]" || name == "[SEP]";
            let span = (!special).then(|| {
                let seg_text = if segment == 0 {
                    &text
                } else {
                    pair.as_ref().unwrap()
                };
                let piece = name.trim_start_matches("##");
                let lower = seg_text.to_lowercase();
                let start = cursor[segment] + lower[cursor[segment]..].find(piece).unwrap();
                cursor[segment] = start + piece.len();
                (start, start + piece.len())
            });
            Token {
                text: name.clone(),
                id: ids[i] as u32,
                span,
                segment,
                special,
            }
        })
        .collect();
    AttentionMaps {
        model: "all-MiniLM-L6-v2 (golden)".to_string(),
        text,
        pair,
        tokens,
        n_layers: shape[0],
        n_heads: shape[1],
        weights,
        rows: None,
    }
}
