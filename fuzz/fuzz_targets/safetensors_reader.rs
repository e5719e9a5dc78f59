//! attn-models' safetensors reader on arbitrary bytes: header length, JSON, offsets, dtypes,
//! overflowing shapes, trailing bytes. Whatever [`Checkpoint::open`] accepts must read back
//! every tensor with exactly `numel` values, the same bytes the `safetensors` crate sees.
#![no_main]

use attn_models::Checkpoint;
use attnscope_fuzz::scratch_file;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = scratch_file("model.safetensors", data);
    let Ok(ckpt) = Checkpoint::open(&path) else {
        return;
    };
    // The header was accepted, so it is valid JSON after the 8-byte length.
    let header_len = u64::from_le_bytes(data[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&data[8..8 + header_len]).expect("accepted header is JSON");
    let other = safetensors::SafeTensors::deserialize(data).ok();
    for name in header.keys().filter(|n| *n != "__metadata__") {
        let info = ckpt
            .info(name)
            .expect("accepted tensor has an entry")
            .clone();
        let numel: usize = info.shape.iter().product();
        let bytes = &data[8 + header_len + info.begin..8 + header_len + info.end];
        if let Some(view) = other.as_ref().and_then(|st| st.tensor(name).ok()) {
            assert_eq!(
                view.data(),
                bytes,
                "{name}: bytes differ from the safetensors crate"
            );
        }
        match ckpt.f32_data(name, &info.shape) {
            Ok(values) => {
                assert_eq!(info.dtype, "F32");
                assert_eq!(values.len(), numel, "{name}: wrong value count");
                let copied = ckpt.f32(name, &info.shape).expect("f32_data succeeded");
                assert_eq!(
                    values.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    copied.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                );
            }
            Err(_) => assert_ne!(info.dtype, "F32", "{name}: an F32 tensor was refused"),
        }
        // A wrong shape is always refused.
        let mut wrong = info.shape.clone();
        wrong.push(1);
        assert!(ckpt.f32_data(name, &wrong).is_err());
    }
});
