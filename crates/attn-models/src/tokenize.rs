//! Text to token ids through the model's own `tokenizer.json` (the `tokenizers` crate), with
//! each token's byte span in its text, its segment, and whether it is a special token.
//!
//! The `tokenizer.json` of a checkpoint may carry padding and truncation settings (MiniLM's pads
//! and truncates to 128); both are switched off, because padding is the batch's business and a
//! text longer than the model's positions is an error unless the caller asks to truncate.

use std::path::Path;
use std::str::FromStr;

use tokenizers::{
    AddedToken, PostProcessor, Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy,
};

use crate::ModelError;
use crate::config::read_text;

/// One tokenized text (or text pair).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoding {
    /// Token ids, the model's input.
    pub ids: Vec<u32>,
    /// The tokenizer's own token strings (`"##ing"`, `"Ġcat"`).
    pub tokens: Vec<String>,
    /// Byte span of each token in its segment's text; `None` for special tokens.
    pub spans: Vec<Option<(usize, usize)>>,
    /// 0 for the text, 1 for the pair; special tokens take the segment they close (BERT's
    /// `token_type_ids`).
    pub segments: Vec<usize>,
    /// Whether each token was added by the tokenizer (`[CLS]`, `[SEP]`).
    pub special: Vec<bool>,
}

impl Encoding {
    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether there are no tokens.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

/// How many tokens a text may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// The model's positions.
    Positions,
    /// Sentence-transformers' `max_seq_length` for embeddings (at most the positions).
    Embedding(usize),
}

/// A model's tokenizer with padding and truncation switched off.
#[derive(Clone)]
pub struct TextTokenizer {
    inner: Tokenizer,
    max_positions: usize,
}

impl TextTokenizer {
    /// The largest id the tokenizer can give (its added tokens' included), if any.
    pub fn max_id(&self) -> Option<u32> {
        let vocab = self.inner.get_vocab(true);
        vocab.values().copied().max()
    }

    /// Loads `tokenizer.json`; texts may use at most `max_positions` tokens.
    pub fn from_file(path: &Path, max_positions: usize) -> Result<TextTokenizer, ModelError> {
        let text = read_text(path, "the model's tokenizer.json")?;
        let mut inner = Tokenizer::from_str(&text).map_err(|e| ModelError::Tokenizer {
            reason: format!("{}: {e}", path.display()),
        })?;
        inner.with_padding(None);
        inner
            .with_truncation(None)
            .map_err(|e| ModelError::Tokenizer {
                reason: e.to_string(),
            })?;
        Ok(TextTokenizer {
            inner,
            max_positions,
        })
    }

    /// Loads `dir/tokenizer.json` with the added tokens `dir/tokenizer_config.json` names (a
    /// chat template's `<|im_start|>`, where tokenizer.json lacks them), as transformers loads
    /// the tokenizer; texts may use at most `max_positions` tokens.
    pub fn from_dir(dir: &Path, max_positions: usize) -> Result<TextTokenizer, ModelError> {
        let mut tokenizer = TextTokenizer::from_file(&dir.join("tokenizer.json"), max_positions)?;
        tokenizer.add_config_tokens(&TokenizerConfig::from_dir(dir)?)?;
        Ok(tokenizer)
    }

    /// Adds the tokens of `config`'s `added_tokens_decoder` and `additional_special_tokens`
    /// that the tokenizer lacks (or holds as plain tokens when they are special). An added
    /// token must get the id the config gives it: one that would get another is an error.
    pub(crate) fn add_config_tokens(&mut self, config: &TokenizerConfig) -> Result<(), ModelError> {
        for (id, token) in &config.added_tokens {
            let known = self.inner.get_added_tokens_decoder().get(id).cloned();
            if known
                .as_ref()
                .is_some_and(|k| k.content == token.content && k.special == token.special)
            {
                continue;
            }
            match token.special {
                true => self.inner.add_special_tokens(std::slice::from_ref(token)),
                false => self.inner.add_tokens(std::slice::from_ref(token)),
            };
            let got = self.inner.token_to_id(&token.content);
            if got != Some(*id) {
                return Err(ModelError::Tokenizer {
                    reason: format!(
                        "tokenizer_config.json's added_tokens_decoder gives {:?} id {id}, and \
                         tokenizer.json {}",
                        token.content,
                        match got {
                            Some(other) => format!("gives it id {other}"),
                            None => "cannot add it".to_string(),
                        }
                    ),
                });
            }
        }
        let missing: Vec<AddedToken> = (config.additional_special_tokens.iter())
            .filter(|t| {
                let id = self.inner.token_to_id(t);
                !id.is_some_and(|id| self.is_special(id))
            })
            .map(|t| AddedToken::from(t.clone(), true))
            .collect();
        self.inner.add_special_tokens(&missing);
        Ok(())
    }

    /// The tokenizer's own string for token `id` (`"Ġcat"`), if the vocabulary has it.
    pub fn token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The id of the vocabulary entry `token` (`"Ġcat"`, `"[MASK]"`), if there is one.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The ids of `word` alone, without special tokens.
    pub fn word_ids(&self, word: &str) -> Result<Vec<u32>, ModelError> {
        let enc = self.inner.encode(word, false).map_err(tokenizer_err)?;
        Ok(enc.get_ids().to_vec())
    }

    /// Whether `id` is one of the tokenizer's special tokens (`[CLS]`, `[PAD]`,
    /// `<|endoftext|>`), which a text may also write itself.
    pub fn is_special(&self, id: u32) -> bool {
        (self.inner.get_added_tokens_decoder().get(&id)).is_some_and(|t| t.special)
    }

    /// The text of `ids`, special tokens included; an id the tokenizer has no token for is
    /// [`ModelError::UnknownTokenId`].
    pub fn decode(&self, ids: &[u32]) -> Result<String, ModelError> {
        if let Some(&id) = ids.iter().find(|&&id| self.inner.id_to_token(id).is_none()) {
            return Err(ModelError::UnknownTokenId { id });
        }
        self.inner
            .decode(ids, false)
            .map_err(|e| ModelError::Tokenizer {
                reason: e.to_string(),
            })
    }

    /// Tokenizes `text` (and `pair`), adding the model's special tokens. Longer than the model's
    /// positions is an error unless `truncate`, which cuts the longest segment first.
    pub fn encode(
        &self,
        text: &str,
        pair: Option<&str>,
        truncate: bool,
    ) -> Result<Encoding, ModelError> {
        self.encode_within(text, pair, Limit::Positions, truncate)
    }

    /// [`TextTokenizer::encode`] within `limit` tokens instead of the model's positions.
    pub fn encode_within<'a>(
        &self,
        text: &'a str,
        pair: Option<&'a str>,
        limit: Limit,
        truncate: bool,
    ) -> Result<Encoding, ModelError> {
        let max = match limit {
            Limit::Positions => self.max_positions,
            Limit::Embedding(n) => n.min(self.max_positions),
        };
        // Whitespace is a text for some tokenizers (GPT-2's "\n", "   "): only an empty one is
        // refused here; one that gives no token is, below.
        if text.is_empty() {
            return Err(ModelError::EmptyText { which: "text" });
        }
        if pair.is_some_and(str::is_empty) {
            return Err(ModelError::EmptyText { which: "pair text" });
        }
        let text = self.first_words_within(text, pair, (max, limit), truncate)?;
        let enc = self.encode_to_fit(text, pair, (max, limit), truncate)?;
        check_segments(&enc, text, pair)?;
        to_encoding(&enc)
    }

    /// `text` as it is, or with `truncate` cut to its first words when they alone pass `max`
    /// tokens; a text (or pair text) whose first words pass it is refused otherwise
    /// ([`ModelError::TooManyWords`]).
    ///
    /// A text of far more words than positions is read by its first words first: their tokens
    /// are the text's first tokens, so when they alone pass the limit the whole text does, and
    /// it is refused (or, a single text with `truncate`, cut from them) without tokenizing the
    /// rest (tens of megabytes take tens of seconds and gigabytes). Words a tokenizer drops
    /// (BERT drops zero-width and control characters) can leave the first words short of the
    /// limit: then the whole text is read.
    fn first_words_within<'a>(
        &self,
        text: &'a str,
        pair: Option<&'a str>,
        (max, limit): (usize, Limit),
        truncate: bool,
    ) -> Result<&'a str, ModelError> {
        let budget = max.saturating_mul(WORDS_PER_POSITION);
        let past_the_limit = |s: &'a str| -> Result<Option<(&'a str, usize)>, ModelError> {
            let Some(first) = first_words(s, budget) else {
                return Ok(None);
            };
            let tokens = self.inner.encode(first, true).map_err(tokenizer_err)?.len();
            Ok((tokens > max).then_some((first, tokens)))
        };
        let mut text = text;
        // A pair cut with `truncate` is cut longest first, which takes both texts' lengths.
        let cut_as_a_pair = truncate && pair.is_some();
        for (which, s) in [("text", Some(text)), ("pair text", pair)] {
            let Some(s) = s.filter(|_| !cut_as_a_pair) else {
                continue;
            };
            let Some((first, tokens)) = past_the_limit(s)? else {
                continue;
            };
            if truncate {
                text = first;
            } else {
                return Err(ModelError::TooManyWords {
                    which,
                    words: s.split_whitespace().count(),
                    first: budget,
                    tokens,
                    max,
                    embedding: matches!(limit, Limit::Embedding(_)),
                    text: None,
                });
            }
        }
        Ok(text)
    }

    /// The tokenizer's encoding of `text` (and `pair`) with the special tokens, within `max`
    /// tokens: longer is [`ModelError::TooLong`], or with `truncate` cut longest first.
    fn encode_to_fit(
        &self,
        text: &str,
        pair: Option<&str>,
        (max, limit): (usize, Limit),
        truncate: bool,
    ) -> Result<tokenizers::Encoding, ModelError> {
        let encode = |tk: &Tokenizer| match pair {
            Some(p) => tk.encode((text, p), true),
            None => tk.encode(text, true),
        };
        let enc = encode(&self.inner).map_err(tokenizer_err)?;
        if enc.len() <= max {
            return Ok(enc);
        }
        if !truncate {
            return Err(ModelError::TooLong {
                tokens: enc.len(),
                max,
                embedding: matches!(limit, Limit::Embedding(_)),
                text: None,
            });
        }
        // Each segment keeps at least one token next to the special ones (tokenizers panics on
        // a limit below them).
        let segments = if pair.is_some() { 2 } else { 1 };
        let special = self
            .inner
            .get_post_processor()
            .map_or(0, |p| p.added_tokens(pair.is_some()));
        if max < special + segments {
            return Err(ModelError::Tokenizer {
                reason: format!(
                    "cannot cut the text to {max} tokens: the tokenizer adds {special} special \
                     tokens, and each of the {segments} text(s) needs one more"
                ),
            });
        }
        let mut tk = self.inner.clone();
        tk.with_truncation(Some(TruncationParams {
            max_length: max,
            strategy: TruncationStrategy::LongestFirst,
            ..TruncationParams::default()
        }))
        .map_err(tokenizer_err)?;
        encode(&tk).map_err(tokenizer_err)
    }
}

/// What `tokenizer_config.json` says that `tokenizer.json` does not: how long a text the
/// tokenizer was made for, and which token classifies.
#[derive(Debug, Clone, Default)]
pub(crate) struct TokenizerConfig {
    pub(crate) model_max_length: Option<usize>,
    pub(crate) cls_token: Option<String>,
    /// `added_tokens_decoder`: each added token's id and its settings.
    pub(crate) added_tokens: Vec<(u32, AddedToken)>,
    /// `additional_special_tokens` (a chat template's tokens, as Qwen lists them).
    pub(crate) additional_special_tokens: Vec<String>,
}

impl TokenizerConfig {
    /// `dir/tokenizer_config.json`, or nothing where the directory has none. transformers
    /// writes "no limit" as a huge number (1e30), which counts as none.
    pub(crate) fn from_dir(dir: &Path) -> Result<TokenizerConfig, ModelError> {
        let path = dir.join("tokenizer_config.json");
        if !crate::config::present(&path) {
            return Ok(TokenizerConfig::default());
        }
        let text = read_text(&path, "the model's tokenizer_config.json")?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| ModelError::Tokenizer {
                reason: format!("{}: {e}", path.display()),
            })?;
        let model_max_length = json
            .get("model_max_length")
            .and_then(serde_json::Value::as_f64)
            .filter(|n| (1.0..1e9).contains(n))
            .map(|n| n as usize);
        // A token is a string, or an AddedToken object with its text in "content".
        let cls_token = json.get("cls_token").and_then(|t| {
            t.as_str()
                .or_else(|| t.get("content")?.as_str())
                .map(str::to_string)
        });
        let bad = |what: String| ModelError::Tokenizer {
            reason: format!("{}: {what}", path.display()),
        };
        let mut added_tokens = Vec::new();
        if let Some(decoder) = json.get("added_tokens_decoder") {
            let decoder = decoder
                .as_object()
                .ok_or_else(|| bad("added_tokens_decoder is not an object".into()))?;
            for (id, token) in decoder {
                let id: u32 = id
                    .parse()
                    .map_err(|_| bad(format!("added_tokens_decoder key {id:?} is not an id")))?;
                let flag = |name: &str| token.get(name).and_then(serde_json::Value::as_bool);
                let content = (token.get("content").and_then(serde_json::Value::as_str))
                    .ok_or_else(|| bad(format!("added token {id} has no \"content\" string")))?;
                let special = flag("special").unwrap_or(false);
                let added = AddedToken::from(content.to_string(), special)
                    .lstrip(flag("lstrip").unwrap_or(false))
                    .rstrip(flag("rstrip").unwrap_or(false))
                    .single_word(flag("single_word").unwrap_or(false))
                    .normalized(flag("normalized").unwrap_or(!special));
                added_tokens.push((id, added));
            }
        }
        added_tokens.sort_by_key(|(id, _)| *id);
        // Each a string, or an AddedToken object with its text in "content".
        let additional_special_tokens = (json.get("additional_special_tokens"))
            .and_then(serde_json::Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|t| t.as_str().or_else(|| t.get("content")?.as_str()))
            .map(str::to_string)
            .collect();
        Ok(TokenizerConfig {
            model_max_length,
            cls_token,
            added_tokens,
            additional_special_tokens,
        })
    }
}

/// One window of a question and its context, as transformers' question-answering pipeline
/// cuts a long context.
pub(crate) struct Window {
    pub(crate) enc: Encoding,
    /// Per token: `Some(0)` for the question, `Some(1)` for the context, `None` for the special
    /// tokens.
    pub(crate) sequence: Vec<Option<usize>>,
    /// Per token: its word's index in its sequence.
    pub(crate) words: Vec<Option<u32>>,
    /// Per token: its byte span in its sequence's text.
    pub(crate) offsets: Vec<(usize, usize)>,
}

impl TextTokenizer {
    /// The mask token (`[MASK]`, `<mask>`) and its id, when the tokenizer has one of them as a
    /// special token.
    pub(crate) fn mask_token(&self) -> Option<(String, u32)> {
        ["[MASK]", "<mask>"].into_iter().find_map(|t| {
            let id = self.inner.token_to_id(t)?;
            self.is_special(id).then(|| (t.to_string(), id))
        })
    }

    /// `question` and `context` in windows of at most `max_len` tokens, the context cut into
    /// pieces overlapping by `stride` tokens (tokenizers' `only_second` truncation with
    /// overflowing tokens, as the pipeline asks for it).
    pub(crate) fn encode_windows(
        &self,
        question: &str,
        context: &str,
        max_len: usize,
        stride: usize,
    ) -> Result<Vec<Window>, ModelError> {
        for (which, s) in [("question", question), ("context", context)] {
            if s.trim().is_empty() {
                return Err(ModelError::EmptyText { which });
            }
        }
        let whole = self
            .inner
            .encode((question, context), true)
            .map_err(tokenizer_err)?;
        let question_tokens = whole
            .get_sequence_ids()
            .iter()
            .filter(|s| **s == Some(0))
            .count();
        let special = self
            .inner
            .get_post_processor()
            .map_or(0, |p| p.added_tokens(true));
        // A context cut into windows must keep more of its tokens in each than the overlap.
        if whole.len() > max_len && question_tokens + special + stride >= max_len {
            return Err(ModelError::QuestionTooLong {
                tokens: question_tokens,
                special,
                max: max_len,
                stride,
            });
        }
        check_segments(&whole, question, Some(context))?;
        let mut tk = self.inner.clone();
        tk.with_truncation(Some(TruncationParams {
            direction: TruncationDirection::Right,
            max_length: max_len,
            strategy: TruncationStrategy::OnlySecond,
            stride,
        }))
        .map_err(tokenizer_err)?;
        let mut first = tk
            .encode((question, context), true)
            .map_err(tokenizer_err)?;
        let rest = first.take_overflowing();
        std::iter::once(first)
            .chain(rest)
            .map(|enc| {
                let sequence = enc.get_sequence_ids();
                let mut window = to_encoding(&enc)?;
                // The question and the context as the segments, whatever the token types
                // (RoBERTa's are all 0): a special token takes the segment it closes.
                let mut last = 0;
                for (segment, s) in window.segments.iter_mut().zip(&sequence) {
                    last = s.unwrap_or(last);
                    *segment = last;
                }
                Ok(Window {
                    sequence,
                    words: enc.get_word_ids().to_vec(),
                    offsets: enc.get_offsets().to_vec(),
                    enc: window,
                })
            })
            .collect()
    }
}

/// A tokenizers error as the model's.
fn tokenizer_err(e: tokenizers::Error) -> ModelError {
    ModelError::Tokenizer {
        reason: e.to_string(),
    }
}

/// Refuses an encoding in which `text` (or `pair`) gave no token of its own: whitespace that
/// BERT drops is an empty text, anything else the tokenizer dropped says so.
fn check_segments(
    enc: &tokenizers::Encoding,
    text: &str,
    pair: Option<&str>,
) -> Result<(), ModelError> {
    for (sequence, which, s) in [(0, "text", Some(text)), (1, "pair text", pair)] {
        let Some(s) = s else { continue };
        if !enc.get_sequence_ids().contains(&Some(sequence)) {
            return Err(match s.trim().is_empty() {
                true => ModelError::EmptyText { which },
                false => ModelError::Tokenizer {
                    reason: format!(
                        "the tokenizer keeps no token of this {which} (tokenizer.json's \
                         normalizer or pre-tokenizer removes all of it)"
                    ),
                },
            });
        }
    }
    Ok(())
}

/// The tokenizer's encoding as an [`Encoding`]; one whose lists disagree in length is
/// [`ModelError::RaggedEncoding`].
fn to_encoding(enc: &tokenizers::Encoding) -> Result<Encoding, ModelError> {
    let (ids, tokens, offsets, segments) = (
        enc.get_ids().len(),
        enc.get_tokens().len(),
        enc.get_offsets().len(),
        enc.get_type_ids().len(),
    );
    let special_marks = enc.get_special_tokens_mask().len();
    if [tokens, offsets, segments, special_marks] != [ids; 4] {
        return Err(ModelError::RaggedEncoding {
            ids,
            tokens,
            offsets,
            segments,
            special_marks,
        });
    }
    let special: Vec<bool> = enc
        .get_special_tokens_mask()
        .iter()
        .map(|&m| m == 1)
        .collect();
    let spans = enc
        .get_offsets()
        .iter()
        .zip(&special)
        .map(|(&span, &s)| (!s).then_some(span))
        .collect();
    Ok(Encoding {
        ids: enc.get_ids().to_vec(),
        tokens: enc.get_tokens().to_vec(),
        spans,
        segments: enc.get_type_ids().iter().map(|&t| t as usize).collect(),
        special,
    })
}

/// Words per position from which a text is refused, or cut, before tokenizing
/// ([`TextTokenizer::encode_within`]): a margin over the one token every word is at least,
/// so texts a little too long still get their exact token count.
const WORDS_PER_POSITION: usize = 4;

/// `text` up to the end of its first `n` words (split at whitespace), when it has more.
fn first_words(text: &str, n: usize) -> Option<&str> {
    let mut words = text.split_whitespace();
    let last = words.nth(n.checked_sub(1)?)?;
    words.next()?;
    // `last` is a slice of `text`: the cut ends where it does.
    let end = last.as_ptr() as usize - text.as_ptr() as usize + last.len();
    Some(&text[..end])
}
