//! One transformer block's dense parts around its attention: the full pass
//! ([`crate::Model::forward`]) and the cached decoding step ([`crate::kv_cache::KvCache::feed`])
//! run the same code, each with its own multiply (GEMMs, or one row's matrix-vector products)
//! and its own attention (the padded batch, or the new rows against the cache).
//!
//! BERT's block is post-norm (transformers' `BertLayer`: the LayerNorm after each residual), GPT-2's
//! pre-norm (`GPT2Block`: `ln_1` and `ln_2` before each sublayer), and so is Llama's
//! (`LlamaDecoderLayer`: RMSNorms, then `down(silu(gate(x)) ⊙ up(x))` for the feed-forward).

use crate::ModelError;
use crate::ops::{Epilogue, Linear, gated_in_place, residual_bias_add};
use crate::weights::Layer;
use crate::{Activation, ModelKind};

/// `y = epilogue(x·W)` for a layer `W`: how a block multiplies.
pub(crate) type Multiply<'m> = dyn Fn(&Linear, &[f32], &mut [f32], Epilogue) + Sync + 'm;

/// The buffers a block writes besides the residual stream, each `[rows, …]`.
pub(crate) struct Buffers<'a> {
    /// GPT-2's and Llama's normed input of a sublayer, `[rows, hidden]` (unused by BERT).
    pub(crate) normed: &'a mut [f32],
    /// `[rows, qkv_width]`: q | k | v, each head's `head_dim` values side by side.
    pub(crate) qkv: &'a mut [f32],
    /// The attention output with the heads merged, `[rows, hidden]`.
    pub(crate) context: &'a mut [f32],
    /// A sublayer's output before its bias and residual, `[rows, hidden]`.
    pub(crate) sublayer: &'a mut [f32],
    /// `[rows, ff_width]`: Llama's gate | up, then its gated product in the first
    /// `rows · intermediate` values.
    pub(crate) intermediate: &'a mut [f32],
}

impl Layer {
    /// This block of a `kind` model on the residual stream `hidden` (`[rows, hidden]`), in
    /// place: the attention sublayer, whose `attend` turns the projected `qkv` into the merged
    /// `context`, then the feed-forward sublayer with `act`.
    pub(crate) fn forward(
        &self,
        (kind, act): (ModelKind, Activation),
        hidden: &mut [f32],
        buf: Buffers<'_>,
        multiply: &Multiply<'_>,
        attend: impl FnOnce(&[f32], &mut [f32]) -> Result<(), ModelError>,
    ) -> Result<(), ModelError> {
        let Buffers {
            normed,
            qkv,
            context,
            sublayer,
            intermediate,
        } = buf;
        self.project(kind, hidden, normed, qkv, multiply);
        attend(qkv, context)?;
        self.after_attention(
            (kind, act),
            hidden,
            context,
            (normed, sublayer, intermediate),
            multiply,
        );
        Ok(())
    }

    /// The attention sublayer's projection of the residual stream `hidden` (BERT) or of its
    /// ln_1 (GPT-2, into `normed`) into `qkv`.
    pub(crate) fn project(
        &self,
        kind: ModelKind,
        hidden: &[f32],
        normed: &mut [f32],
        qkv: &mut [f32],
        multiply: &Multiply<'_>,
    ) {
        let x: &[f32] = match kind {
            ModelKind::Bert => hidden,
            ModelKind::Gpt2 | ModelKind::Llama => {
                self.norm_attn.apply_into(hidden, normed);
                normed
            }
        };
        multiply(&self.qkv, x, qkv, Epilogue::Bias);
    }

    /// The rest of the block once attention has written `context` for the rows of `hidden`
    /// (`[rows, hidden]`, updated in place): the output projection and its residual, then the
    /// feed-forward sublayer. `buf` is `(normed, sublayer, intermediate)` for those rows.
    pub(crate) fn after_attention(
        &self,
        (kind, act): (ModelKind, Activation),
        hidden: &mut [f32],
        context: &[f32],
        (normed, sublayer, intermediate): (&mut [f32], &mut [f32], &mut [f32]),
        multiply: &Multiply<'_>,
    ) {
        self.attention_residual(kind, hidden, context, sublayer, multiply);
        self.feed_forward(
            (kind, act),
            hidden,
            (normed, sublayer, intermediate),
            multiply,
        );
    }

    /// The attention's output projection of `context` and its residual (and BERT's norm)
    /// into `hidden`, through the buffer `sublayer`.
    pub(crate) fn attention_residual(
        &self,
        kind: ModelKind,
        hidden: &mut [f32],
        context: &[f32],
        sublayer: &mut [f32],
        multiply: &Multiply<'_>,
    ) {
        multiply(&self.attn_out, context, sublayer, Epilogue::None);
        self.end_sublayer(kind, (hidden, sublayer), (&self.attn_out, true));
    }

    /// The feed-forward sublayer on `hidden` and its residual, in place.
    pub(crate) fn feed_forward(
        &self,
        (kind, act): (ModelKind, Activation),
        hidden: &mut [f32],
        (normed, sublayer, intermediate): (&mut [f32], &mut [f32], &mut [f32]),
        multiply: &Multiply<'_>,
    ) {
        // Feed-forward: the same input for each family.
        let x: &[f32] = match kind {
            ModelKind::Bert => hidden,
            ModelKind::Gpt2 | ModelKind::Llama => {
                self.norm_ff.apply_into(hidden, normed);
                normed
            }
        };
        let inner: &[f32] = match kind {
            ModelKind::Llama => {
                let n = self.ff_out.n_in;
                multiply(&self.ff_in, x, intermediate, Epilogue::Bias);
                gated_in_place(intermediate, n, act);
                &intermediate[..intermediate.len() / 2]
            }
            _ => {
                multiply(&self.ff_in, x, intermediate, Epilogue::BiasActivation(act));
                intermediate
            }
        };
        multiply(&self.ff_out, inner, sublayer, Epilogue::None);
        self.end_sublayer(kind, (hidden, sublayer), (&self.ff_out, false));
    }

    /// A sublayer's end: `hidden += y + bias` (`proj`'s), then for BERT the LayerNorm after the
    /// attention sublayer (`attention`) or after the feed-forward one.
    fn end_sublayer(
        &self,
        kind: ModelKind,
        (hidden, y): (&mut [f32], &mut [f32]),
        (proj, attention): (&Linear, bool),
    ) {
        match (kind, attention, &self.post_norms) {
            (ModelKind::Bert, true, _) => self.norm_attn.residual_bias_apply(hidden, y, &proj.bias),
            (ModelKind::Bert, false, _) => self.norm_ff.residual_bias_apply(hidden, y, &proj.bias),
            (ModelKind::Llama, attention, Some((post_attn, post_ff))) => {
                // Gemma 2: the sublayer's output is normed before the residual adds it.
                Epilogue::Bias.apply(y, &proj.bias, 0..proj.bias.len());
                match attention {
                    true => post_attn.apply(y),
                    false => post_ff.apply(y),
                }
                hidden.iter_mut().zip(&*y).for_each(|(h, y)| *h += y);
            }
            (ModelKind::Gpt2 | ModelKind::Llama, _, _) => residual_bias_add(hidden, y, &proj.bias),
        }
    }
}
