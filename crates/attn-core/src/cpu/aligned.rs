//! Buffers that start on a cache line, for the GEMM operands the kernels load 16 values at a
//! time: a 64-value row then never splits across two lines, which would slow every load of
//! it.

/// A growable buffer whose first element sits on a 64-byte boundary (a cache line), so that
/// rows of 64 bytes load without splitting lines. Growing it may move the contents: callers
/// overwrite (or zero) what they use.
pub(crate) struct Aligned<T = f32> {
    buf: Vec<T>,
    off: usize,
    len: usize,
}

impl<T> Default for Aligned<T> {
    fn default() -> Self {
        Aligned {
            buf: Vec::new(),
            off: 0,
            len: 0,
        }
    }
}

impl<T: Copy + Default> Aligned<T> {
    /// Elements of slack that always hold a 64-byte boundary.
    const SLACK: usize = 64 / size_of::<T>();

    /// Makes room for `n` values and returns them; on a fresh buffer they are all
    /// `T::default()`.
    pub(crate) fn get(&mut self, n: usize) -> &mut [T] {
        if self.buf.len() < n + Self::SLACK {
            self.buf.resize(n + Self::SLACK, T::default());
            // In `T` units; `align_offset` may in principle give up (usize::MAX): then 0.
            let off = self.buf.as_ptr().align_offset(64);
            self.off = if off < Self::SLACK { off } else { 0 };
        }
        self.len = n;
        &mut self.buf[self.off..][..n]
    }

    /// The first `n` values (as last made room for by [`Aligned::get`]).
    pub(crate) fn view(&self, n: usize) -> &[T] {
        &self.buf[self.off..][..n]
    }

    /// The values the last [`Aligned::get`] made room for.
    pub(crate) fn all(&self) -> &[T] {
        self.view(self.len)
    }

    /// The values the last [`Aligned::get`] made room for, writable.
    pub(crate) fn all_mut(&mut self) -> &mut [T] {
        &mut self.buf[self.off..][..self.len]
    }
}

impl<T: Copy + Default> Clone for Aligned<T> {
    /// A copy on its own cache line (a derived clone would keep the offset of another
    /// allocation).
    fn clone(&self) -> Self {
        let mut copy = Aligned::default();
        copy.get(self.len).copy_from_slice(self.all());
        copy
    }
}

impl<T: Copy + Default + PartialEq> PartialEq for Aligned<T> {
    fn eq(&self, other: &Self) -> bool {
        self.all() == other.all()
    }
}

impl<T: Copy + Default + std::fmt::Debug> std::fmt::Debug for Aligned<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.all()).finish()
    }
}

/// `n` zeros written one by one, for a buffer that is read before it is written.
///
/// `vec![0.0; n]` maps a large buffer to the kernel's shared zero page: a read maps that page
/// and the first write then takes a copy-on-write fault whose TLB flush interrupts every other
/// core. Writing the zeros takes plain first-touch faults instead.
pub(crate) fn zeros_written(n: usize) -> Vec<f32> {
    let mut buf = Vec::with_capacity(n);
    buf.resize(n, 0.0);
    buf
}

/// A block of the output, zeroed: its pages fault in on the thread that computes it.
pub(crate) fn zeroed(block: &mut [std::mem::MaybeUninit<f32>]) -> &mut [f32] {
    block.fill(std::mem::MaybeUninit::new(0.0));
    // SAFETY: every value was just written, and `MaybeUninit<f32>` has the layout of `f32`.
    unsafe { &mut *(block as *mut [std::mem::MaybeUninit<f32>] as *mut [f32]) }
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
            assert_eq!(buf.all().len(), n);
        }
        let mut bits = Aligned::<u16>::default();
        for n in [7, 3000, 64] {
            let x = bits.get(n);
            assert_eq!((x.len(), x.as_ptr() as usize % 64), (n, 0));
            assert_eq!(bits.all_mut().len(), n);
            bits.all_mut()[n - 1] = 7;
            let copy = bits.clone();
            assert_eq!((copy.all().as_ptr() as usize % 64, &copy), (0, &bits));
        }
    }
}
