//! Cache-line padding.

use std::ops::{Deref, DerefMut};

/// Pads and aligns `T` to 128 bytes so that two `CachePadded` values never
/// share a cache line.
///
/// 128 rather than 64: on x86-64 the L2 "spatial prefetcher" pulls cache lines
/// in adjacent pairs, so two hot atomics 64 bytes apart still interfere; on
/// aarch64 (Apple M-series and some Neoverse parts) the line itself is 128
/// bytes. Used for queue head/tail, per-slot job state and per-worker counters.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct CachePadded<T>(T);

impl<T> CachePadded<T> {
    /// Wraps `value`.
    pub const fn new(value: T) -> Self {
        Self(value)
    }

    /// Unwraps the value.
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T> Deref for CachePadded<T> {
    type Target = T;
    #[inline(always)]
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> DerefMut for CachePadded<T> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

#[cfg(test)]
mod tests {
    use super::CachePadded;

    #[test]
    fn alignment_and_size() {
        assert_eq!(std::mem::align_of::<CachePadded<u8>>(), 128);
        assert_eq!(std::mem::size_of::<CachePadded<u64>>(), 128);
        let v = [CachePadded::new(1u64), CachePadded::new(2u64)];
        let a = &*v[0] as *const u64 as usize;
        let b = &*v[1] as *const u64 as usize;
        assert_eq!(b - a, 128);
        let [_, second] = v;
        assert_eq!(second.into_inner(), 2);
    }
}
