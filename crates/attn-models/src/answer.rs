//! Extractive question answering as transformers' `pipeline("question-answering")` gives it
//! with its defaults (transformers 4.57, `pipelines/question_answering.py`): the context in
//! windows of `min(model_max_length, 384)` tokens overlapping by half a window (at most 128),
//! in each window a softmax of the start and of the end logits over every token with the
//! question and special tokens set to −10000 (the `[CLS]` kept, then its probability set to 0),
//! the twelve best spans of at most 15 tokens by `p_start · p_end`, each widened to whole words
//! of the context, and the scores of spans with the same text (ignoring case) added, over all
//! windows.

use crate::tokenize::Window;
use crate::{Model, ModelError, ModelOutput, RunOptions, SpanLogits};

/// The longest answer, in tokens (the pipeline's `max_answer_len`).
pub const MAX_ANSWER_TOKENS: usize = 15;
/// The longest window (the pipeline's `max_seq_len` when the tokenizer allows more).
pub const MAX_WINDOW: usize = 384;
/// Spans kept per window before they are widened to words (`top_k · 2 + 10` for `top_k` 1).
const SPANS_PER_WINDOW: usize = 12;
/// The logit the pipeline gives tokens that cannot be part of an answer.
const MASKED_LOGIT: f32 = -10000.0;

/// The answer to a question, in its context.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The answer's text, cut from the context.
    pub text: String,
    /// Its first character in the context (a character index, as Python counts).
    pub start: usize,
    /// The character after its last.
    pub end: usize,
    /// The summed `p_start · p_end` of the spans that give this text.
    pub score: f32,
    /// The window and tokens (first, last) of its best span.
    pub span: (usize, usize, usize),
}

/// A question answered: the best answer, and the run it came from.
#[derive(Debug, Clone)]
pub struct Answered {
    /// The best answer; `None` when no span of the context could be one.
    pub answer: Option<Answer>,
    /// Every window's tokens (`[CLS] question [SEP] part of the context [SEP]`).
    pub windows: Vec<crate::Encoding>,
    /// The forward pass over the windows (a batch, one text per window).
    pub output: ModelOutput,
    /// The head's logits per window.
    pub logits: Vec<SpanLogits>,
}

/// `x` turned into probabilities where `keep`, the pipeline's way: others at −10000, then
/// `e^(x − max) / Σ`, in f32 as numpy takes the logits.
fn probabilities(x: &[f32], keep: &[bool]) -> Vec<f32> {
    let x: Vec<f32> = x
        .iter()
        .zip(keep)
        .map(|(&v, &k)| if k { v } else { MASKED_LOGIT })
        .collect();
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f32> = x.iter().map(|&v| (v - max).exp()).collect();
    let sum: f32 = e.iter().sum();
    e.iter().map(|&v| v / sum).collect()
}

/// The best spans `(first, last, score)` of one window, best first: the pipeline's
/// `select_starts_ends` and `decode_spans`.
fn best_spans(logits: &SpanLogits, keep: &[bool]) -> Vec<(usize, usize, f32)> {
    let mut start = probabilities(&logits.start, keep);
    let mut end = probabilities(&logits.end, keep);
    start[0] = 0.0;
    end[0] = 0.0;
    let n = start.len();
    let mut spans: Vec<(usize, usize, f32)> = (0..n)
        .flat_map(|s| (s..n.min(s + MAX_ANSWER_TOKENS)).map(move |e| (s, e)))
        .map(|(s, e)| (s, e, start[s] * end[e]))
        .collect();
    spans.sort_by(|a, b| b.2.total_cmp(&a.2).then((a.0, a.1).cmp(&(b.0, b.1))));
    spans.truncate(SPANS_PER_WINDOW);
    // The pipeline keeps spans whose ends are context tokens; its test also lets token 0 pass
    // (it reads the indices of a [1, T] mask, whose row indices are 0).
    spans.retain(|&(s, e, _)| (keep[s] || s == 0) && (keep[e] || e == 0));
    spans
}

/// The character span of whole words of the context that tokens `s..=e` of `w` fall in (the
/// pipeline's `align_to_words`), else the tokens' own offsets; as byte offsets.
fn widen(w: &Window, s: usize, e: usize) -> (usize, usize) {
    let word_span = |t: usize| -> Option<(usize, usize)> {
        let word = w.words[t]?;
        let tokens =
            (0..w.words.len()).filter(|&i| w.words[i] == Some(word) && w.sequence[i] == Some(1));
        let (mut lo, mut hi) = (usize::MAX, 0);
        for i in tokens {
            lo = lo.min(w.offsets[i].0);
            hi = hi.max(w.offsets[i].1);
        }
        (lo <= hi).then_some((lo, hi))
    };
    match (word_span(s), word_span(e)) {
        (Some((start, _)), Some((_, end))) => (start, end),
        _ => (w.offsets[s].0, w.offsets[e].1),
    }
}

impl Model {
    /// The window length and overlap the pipeline uses for this model:
    /// `min(model_max_length, 384)` (and the model's positions), and half of it, at most 128.
    pub fn answer_windows(&self) -> (usize, usize) {
        let max = self
            .model_max_length()
            .unwrap_or(MAX_WINDOW)
            .min(MAX_WINDOW)
            .min(self.max_positions());
        (max, (max / 2).min(128))
    }

    /// Answers `question` from `context` with the checkpoint's question-answering head.
    pub fn answer(
        &self,
        question: &str,
        context: &str,
        options: &RunOptions,
    ) -> Result<Answered, ModelError> {
        // The head is checked first: a bare encoder's run would be wasted.
        let qa = self.qa_head()?;
        let windows = self.windows(question, context)?;
        let encs: Vec<crate::Encoding> = windows.iter().map(|w| w.enc.clone()).collect();
        let output = self.forward_batch(&encs, options)?;
        let logits = crate::heads::span_logits(
            qa,
            (&output.last_hidden_state, output.seq_len, &output.lengths),
        );
        Ok(Answered {
            answer: self.best_answer(context, &windows, &logits),
            windows: encs,
            output,
            logits,
        })
    }

    /// The answer to each `(question, context)`, their windows run together for throughput
    /// as [`Model::classify_all`] runs texts. An error names its question's index.
    pub fn answer_all(
        &self,
        questions: &[(&str, &str)],
    ) -> Result<Vec<Option<Answer>>, ModelError> {
        let qa = self.qa_head()?;
        if questions.is_empty() {
            return Err(ModelError::EmptyBatch);
        }
        let windows = (questions.iter().enumerate())
            .map(|(i, (q, c))| {
                (self.windows(q, c)).map_err(|e| ModelError::Input {
                    index: i,
                    error: Box::new(e),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let encs: Vec<crate::Encoding> = windows.iter().flatten().map(|w| w.enc.clone()).collect();
        // Which question each window is of, to name it in an error.
        let owner: Vec<usize> = (windows.iter().enumerate())
            .flat_map(|(i, w)| std::iter::repeat_n(i, w.len()))
            .collect();
        let logits = self
            .run_in_shares(
                &encs,
                |_| None,
                |hidden, run, _| {
                    Ok(crate::heads::span_logits(
                        qa,
                        (hidden, run.seq_len, &run.lengths),
                    ))
                },
            )
            .map_err(|e| match e.text() {
                Some(w) => e.in_text(owner[w]),
                None => e,
            })?;
        let mut logits = logits.as_slice();
        Ok((questions.iter().zip(&windows))
            .map(|((_, context), w)| {
                let (these, rest) = logits.split_at(w.len());
                logits = rest;
                self.best_answer(context, w, these)
            })
            .collect())
    }

    /// `question` and `context` in the pipeline's windows.
    fn windows(&self, question: &str, context: &str) -> Result<Vec<Window>, ModelError> {
        let (max, stride) = self.answer_windows();
        self.tokenizer()
            .encode_windows(question, context, max, stride)
    }

    /// The best answer over every window's spans.
    fn best_answer(
        &self,
        context: &str,
        windows: &[Window],
        logits: &[SpanLogits],
    ) -> Option<Answer> {
        let cls = self.cls_token_id();
        let mut answers: Vec<Answer> = Vec::new();
        for (n, (w, l)) in windows.iter().zip(logits).enumerate() {
            let keep: Vec<bool> = (0..w.enc.len())
                .map(|t| w.sequence[t] == Some(1) || Some(w.enc.ids[t]) == cls)
                .collect();
            for (s, e, score) in best_spans(l, &keep) {
                let (from, to) = widen(w, s, e);
                let text = context.get(from..to).unwrap_or_default();
                let chars = |at: usize| context.get(..at).map_or(0, |s| s.chars().count());
                match answers
                    .iter_mut()
                    .find(|a| a.text.to_lowercase() == text.to_lowercase())
                {
                    Some(a) => a.score += score,
                    None => answers.push(Answer {
                        text: text.to_string(),
                        start: chars(from),
                        end: chars(to),
                        score,
                        span: (n, s, e),
                    }),
                }
            }
        }
        // Python's sort is stable: equal scores keep the order they were found in.
        answers.sort_by(|a, b| b.score.total_cmp(&a.score));
        answers.into_iter().next()
    }
}
