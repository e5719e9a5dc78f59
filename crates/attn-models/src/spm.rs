//! SentencePiece models (`source.spm`, `target.spm` of the Marian checkpoints) read without
//! the C++ library: the model's protobuf (sentencepiece_model.proto, `ModelProto`) parsed by a
//! small reader, and a `tokenizers` Unigram tokenizer built from it as transformers'
//! `SpmConverter` builds one (convert_slow_tokenizer.py): the pieces and their scores, the
//! normaliser's precompiled character map, trailing whitespace stripped, runs of spaces as one
//! "▁", and "▁" before every word. MarianTokenizer then maps each piece to its id through
//! `vocab.json` (tokenization_marian.py).

use std::collections::HashMap;
use std::path::Path;

use tokenizers::models::unigram::Unigram;
use tokenizers::normalizers::{Precompiled, Replace, Sequence, Strip};
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::{AddedToken, NormalizerWrapper, Tokenizer};

use crate::ModelError;
use crate::tokenize::Encoding;

/// A piece's type (sentencepiece_model.proto, `SentencePiece.Type`).
const CONTROL: u64 = 3;
const USER_DEFINED: u64 = 4;

/// What the tokenizer needs of a `ModelProto`.
#[derive(Debug, Default)]
struct SpmModel {
    /// `(piece, score, type)`.
    pieces: Vec<(String, f32, u64)>,
    /// `TrainerSpec.model_type`: 1 unigram.
    model_type: u64,
    unk_id: usize,
    precompiled_charsmap: Vec<u8>,
}

/// A protobuf field: its number and its value.
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed32(u32),
    Fixed64,
}

/// The fields of one protobuf message, in order.
fn fields(mut bytes: &[u8]) -> Result<Vec<(u64, Field<'_>)>, String> {
    fn varint(bytes: &mut &[u8]) -> Result<u64, String> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = bytes.split_first().ok_or("a varint runs past the end")?;
            *bytes = rest;
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("a varint longer than 10 bytes".into())
    }
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let key = varint(&mut bytes)?;
        let field = match key & 7 {
            0 => Field::Varint(varint(&mut bytes)?),
            1 => {
                bytes = bytes.get(8..).ok_or("a 64-bit field runs past the end")?;
                Field::Fixed64
            }
            2 => {
                let len = usize::try_from(varint(&mut bytes)?).map_err(|_| "a huge length")?;
                let (value, rest) = (bytes.get(..len), bytes.get(len..));
                bytes = rest.ok_or("a length-delimited field runs past the end")?;
                Field::Bytes(value.ok_or("a length-delimited field runs past the end")?)
            }
            5 => {
                let value = bytes.get(..4).ok_or("a 32-bit field runs past the end")?;
                bytes = &bytes[4..];
                Field::Fixed32(u32::from_le_bytes(value.try_into().map_err(|_| "4 bytes")?))
            }
            other => return Err(format!("wire type {other} is not protobuf's")),
        };
        out.push((key >> 3, field));
    }
    Ok(out)
}

fn parse(bytes: &[u8]) -> Result<SpmModel, String> {
    let mut model = SpmModel {
        model_type: 1,
        ..SpmModel::default()
    };
    for (number, field) in fields(bytes)? {
        match (number, field) {
            (1, Field::Bytes(piece)) => {
                let (mut text, mut score, mut kind) = (String::new(), 0.0, 1);
                for (n, f) in fields(piece)? {
                    match (n, f) {
                        (1, Field::Bytes(b)) => {
                            text = String::from_utf8(b.to_vec())
                                .map_err(|_| "a piece is not UTF-8".to_string())?;
                        }
                        (2, Field::Fixed32(bits)) => score = f32::from_bits(bits),
                        (3, Field::Varint(v)) => kind = v,
                        _ => {}
                    }
                }
                model.pieces.push((text, score, kind));
            }
            (2, Field::Bytes(spec)) => {
                for (n, f) in fields(spec)? {
                    match (n, f) {
                        (3, Field::Varint(v)) => model.model_type = v,
                        (40, Field::Varint(v)) => model.unk_id = v as usize,
                        _ => {}
                    }
                }
            }
            (3, Field::Bytes(spec)) => {
                for (n, f) in fields(spec)? {
                    if let (2, Field::Bytes(map)) = (n, f) {
                        model.precompiled_charsmap = map.to_vec();
                    }
                }
            }
            _ => {}
        }
    }
    if model.model_type != 1 {
        return Err(format!(
            "its model type is {} (only unigram, 1, is read)",
            model.model_type
        ));
    }
    if model.unk_id >= model.pieces.len() {
        return Err(format!(
            "its unknown piece {} is past its {} pieces",
            model.unk_id,
            model.pieces.len()
        ));
    }
    Ok(model)
}

/// The `tokenizers` tokenizer of the SentencePiece model in `path`.
fn spm_tokenizer(path: &Path) -> Result<Tokenizer, ModelError> {
    let bad = |reason: String| ModelError::Tokenizer {
        reason: format!("{}: {reason}", path.display()),
    };
    let bytes =
        std::fs::read(path).map_err(|e| ModelError::io(path, "a SentencePiece model", e))?;
    let model = parse(&bytes).map_err(|e| bad(format!("not a SentencePiece model: {e}")))?;
    let vocab = (model.pieces.iter())
        .map(|(p, s, _)| (p.clone(), f64::from(*s)))
        .collect();
    let unigram =
        Unigram::from(vocab, Some(model.unk_id), false).map_err(|e| bad(e.to_string()))?;
    let mut tokenizer = Tokenizer::new(unigram);
    let mut steps: Vec<NormalizerWrapper> = Vec::new();
    if !model.precompiled_charsmap.is_empty() {
        let map = Precompiled::from(&model.precompiled_charsmap).map_err(|e| bad(e.to_string()))?;
        steps.push(map.into());
    }
    steps.push(Strip::new(false, true).into());
    let spaces = Replace::new(
        tokenizers::normalizers::replace::ReplacePattern::Regex(" {2,}".into()),
        "▁",
    )
    .map_err(|e| bad(e.to_string()))?;
    steps.push(spaces.into());
    tokenizer.with_normalizer(Some(Sequence::new(steps)));
    tokenizer.with_pre_tokenizer(Some(Metaspace::new('▁', PrependScheme::Always, true)));
    let added: Vec<AddedToken> = (model.pieces.iter())
        .filter(|(_, _, kind)| [CONTROL, USER_DEFINED].contains(kind))
        .map(|(piece, _, kind)| AddedToken::from(piece.clone(), *kind == CONTROL).normalized(false))
        .collect();
    tokenizer.add_tokens(&added);
    Ok(tokenizer)
}

/// transformers' `MarianTokenizer`: the source's and the target's SentencePiece models, and
/// `vocab.json`'s ids for their pieces (a piece it lacks is `<unk>`); `</s>` after each text.
#[derive(Clone)]
pub struct MarianTokenizer {
    source: Tokenizer,
    target: Tokenizer,
    ids: HashMap<String, u32>,
    pieces: Vec<String>,
    eos: u32,
    unk: u32,
    pad: Option<u32>,
}

impl MarianTokenizer {
    /// The largest id of vocab.json.
    pub fn max_id(&self) -> Option<u32> {
        self.ids.values().copied().max()
    }

    /// Reads `dir`'s source.spm, target.spm and vocab.json.
    pub fn from_dir(dir: &Path) -> Result<MarianTokenizer, ModelError> {
        let path = dir.join("vocab.json");
        let text = crate::config::read_text(&path, "the model's vocab.json")?;
        let bad = |reason: String| ModelError::Tokenizer {
            reason: format!("{}: {reason}", path.display()),
        };
        let ids: HashMap<String, u32> =
            serde_json::from_str(&text).map_err(|e| bad(format!("not a piece → id map: {e}")))?;
        let n = ids.values().max().map_or(0, |&m| m as usize + 1);
        let mut pieces = vec![String::new(); n];
        for (piece, &id) in &ids {
            pieces[id as usize] = piece.clone();
        }
        let id = |name: &str| ids.get(name).copied();
        let (eos, unk) = match (id("</s>"), id("<unk>")) {
            (Some(eos), Some(unk)) => (eos, unk),
            _ => return Err(bad("it needs the pieces </s> and <unk>".into())),
        };
        Ok(MarianTokenizer {
            source: spm_tokenizer(&dir.join("source.spm"))?,
            target: spm_tokenizer(&dir.join("target.spm"))?,
            pad: id("<pad>"),
            ids,
            pieces,
            eos,
            unk,
        })
    }

    /// `text` as the source's (or, with `target`, the target's) ids, `</s>` last; a leading
    /// language code (`>>fr<<`) is one piece.
    pub fn encode(&self, text: &str, target: bool) -> Result<Encoding, ModelError> {
        let err = |e: tokenizers::Error| ModelError::Tokenizer {
            reason: e.to_string(),
        };
        let mut enc = Encoding {
            ids: Vec::new(),
            tokens: Vec::new(),
            spans: Vec::new(),
            segments: Vec::new(),
            special: Vec::new(),
        };
        let push = |enc: &mut Encoding, piece: &str, span: Option<(usize, usize)>| {
            let id = self.ids.get(piece).copied().unwrap_or(self.unk);
            enc.ids.push(id);
            enc.tokens.push(piece.to_string());
            enc.special.push(span.is_none());
            enc.spans.push(span);
            enc.segments.push(0);
        };
        let mut rest = (text, 0);
        if text.starts_with(">>")
            && let Some(end) = text.find("<<")
        {
            push(&mut enc, &text[..end + 2], Some((0, end + 2)));
            rest = (&text[end + 2..], end + 2);
        }
        let spm = if target { &self.target } else { &self.source };
        let pieces = spm.encode(rest.0, false).map_err(err)?;
        for (piece, &(a, b)) in pieces.get_tokens().iter().zip(pieces.get_offsets()) {
            push(&mut enc, piece, Some((a + rest.1, b + rest.1)));
        }
        push(&mut enc, "</s>", None);
        Ok(enc)
    }

    /// The piece of `id`, if vocab.json has it.
    pub fn token(&self, id: u32) -> Option<String> {
        self.pieces
            .get(id as usize)
            .filter(|p| !p.is_empty())
            .cloned()
    }

    /// Whether `id` is `</s>` or `<pad>`, the tokens MarianTokenizer marks special.
    pub fn is_special(&self, id: u32) -> bool {
        id == self.eos || Some(id) == self.pad
    }

    /// The text of target `ids`: the pieces joined, "▁" as spaces, special tokens dropped.
    pub fn decode(&self, ids: &[u32]) -> String {
        let text: String = (ids.iter())
            .filter(|&&id| !self.is_special(id))
            .filter_map(|&id| self.token(id))
            .collect();
        text.replace('▁', " ").trim_start().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_protobufs_are_errors() {
        // A length past the end, a varint that never ends, a wire type protobuf lacks.
        for bytes in [&[0x0a, 0x05, 0x01][..], &[0x08, 0xff, 0xff], &[0x0b]] {
            assert!(parse(bytes).is_err(), "{bytes:?}");
        }
        // No pieces: the unknown piece is past them.
        assert!(parse(&[]).unwrap_err().contains("past its 0 pieces"));
    }
}
