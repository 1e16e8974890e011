//! Copies with non-temporal stores, for outputs nobody rereads soon: the
//! destination lines are written without being read first (no
//! read-for-ownership) and without evicting the cache's working set.

/// Reductions whose per-rank buffer times the number of ranks is at least
/// this large (copies: half of it per rank's buffer) write their outputs
/// with non-temporal stores; smaller ones stay in cache, where the caller
/// will likely read them next.
pub const NT_MIN_BYTES: usize = 8 << 20;

/// Copies `src` to `dst` (`src.len()` bytes), with non-temporal stores for
/// the 16-byte aligned middle on x86-64, and ends with a store fence so that
/// a later release store orders after the data.
///
/// # Safety
/// `dst` must be valid for `src.len()` bytes of writes and not overlap `src`.
pub unsafe fn copy(dst: *mut u8, src: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        let n = src.len();
        let head = dst.align_offset(16).min(n);
        // SAFETY: the caller's contract covers every range below.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), dst, head);
            let body = (n - head) / 16;
            for i in 0..body {
                let off = head + i * 16;
                let v = _mm_loadu_si128(src.as_ptr().add(off).cast::<__m128i>());
                _mm_stream_si128(dst.add(off).cast::<__m128i>(), v);
            }
            let done = head + body * 16;
            std::ptr::copy_nonoverlapping(src.as_ptr().add(done), dst.add(done), n - done);
            _mm_sfence();
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: per the contract.
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_every_alignment_and_length() {
        let src: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
        for off in 0..17 {
            for len in [0usize, 1, 15, 16, 17, 100, 977] {
                let mut dst = vec![0u8; 1040];
                // SAFETY: `dst` has room for off + len bytes.
                unsafe { copy(dst.as_mut_ptr().add(off), &src[..len]) };
                assert_eq!(&dst[off..off + len], &src[..len], "off {off} len {len}");
                assert!(dst[..off].iter().all(|&b| b == 0));
                assert!(dst[off + len..].iter().all(|&b| b == 0));
            }
        }
    }
}
