//! Copies with non-temporal stores, for outputs nobody rereads soon: the
//! destination lines are written without being read first (no
//! read-for-ownership) and without evicting the cache's working set.

/// Reductions whose per-rank buffer times the number of ranks is at least
/// this large (copies: half of it per rank's buffer) write their outputs
/// with non-temporal stores; smaller ones stay in cache, where the caller
/// will likely read them next.
pub const NT_MIN_BYTES: usize = 8 << 20;

/// Copies `src` to `dst` (`src.len()` bytes) as [`stream`] does, then
/// fences (see [`fence`]) so that a later release store orders after the
/// data.
///
/// # Safety
/// `dst` must be valid for `src.len()` bytes of writes and not overlap `src`.
pub unsafe fn copy(dst: *mut u8, src: &[u8]) {
    // SAFETY: per the contract.
    unsafe { stream(dst, src) };
    fence();
}

/// Orders every earlier non-temporal store before later stores (`sfence`);
/// a no-op where [`stream`] uses ordinary stores.
pub fn fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE (hence sfence) is part of x86-64.
    unsafe {
        std::arch::x86_64::_mm_sfence();
    }
}

/// Copies `src` to `dst` (`src.len()` bytes) with non-temporal stores for
/// the aligned middle on x86-64: 32-byte stores where the CPU has AVX, else
/// 16-byte ones. Does not fence: call [`fence`] before publishing.
///
/// # Safety
/// `dst` must be valid for `src.len()` bytes of writes and not overlap `src`.
pub unsafe fn stream(dst: *mut u8, src: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx") {
            // SAFETY: the CPU has AVX; the caller's contract.
            unsafe { stream32(dst, src) };
        } else {
            // SAFETY: the caller's contract.
            unsafe { stream16(dst, src) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: per the contract.
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len());
    }
}

/// [`stream`] with 32-byte stores, two per iteration (one cache line).
///
/// # Safety
/// As [`stream`]; the CPU must have AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn stream32(dst: *mut u8, src: &[u8]) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_stream_si256};
    let n = src.len();
    let head = dst.align_offset(32).min(n);
    let s = src.as_ptr();
    // SAFETY: the caller's contract covers every range below; stores at
    // `head + 32·i` are 32-byte aligned.
    unsafe {
        std::ptr::copy_nonoverlapping(s, dst, head);
        let lines = (n - head) / 64;
        for i in 0..lines {
            let off = head + i * 64;
            let v0 = _mm256_loadu_si256(s.add(off).cast::<__m256i>());
            let v1 = _mm256_loadu_si256(s.add(off + 32).cast::<__m256i>());
            _mm256_stream_si256(dst.add(off).cast::<__m256i>(), v0);
            _mm256_stream_si256(dst.add(off + 32).cast::<__m256i>(), v1);
        }
        let mut done = head + lines * 64;
        if n - done >= 32 {
            let v = _mm256_loadu_si256(s.add(done).cast::<__m256i>());
            _mm256_stream_si256(dst.add(done).cast::<__m256i>(), v);
            done += 32;
        }
        std::ptr::copy_nonoverlapping(s.add(done), dst.add(done), n - done);
    }
}

/// [`stream`] with 16-byte stores (SSE2, part of x86-64).
///
/// # Safety
/// As [`stream`].
#[cfg(target_arch = "x86_64")]
unsafe fn stream16(dst: *mut u8, src: &[u8]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` (a copy routine) over every destination alignment within
    /// a cache line and lengths around the 16-, 32- and 64-byte steps.
    fn check_every_alignment_and_length(f: unsafe fn(*mut u8, &[u8])) {
        let src: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
        for off in 0..65 {
            for len in [
                0usize, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 95, 96, 100, 977,
            ] {
                let mut dst = vec![0u8; 1100];
                // SAFETY: `dst` has room for off + len bytes.
                unsafe { f(dst.as_mut_ptr().add(off), &src[..len]) };
                fence();
                assert_eq!(&dst[off..off + len], &src[..len], "off {off} len {len}");
                assert!(dst[..off].iter().all(|&b| b == 0));
                assert!(dst[off + len..].iter().all(|&b| b == 0));
            }
        }
    }

    #[test]
    fn copies_every_alignment_and_length() {
        check_every_alignment_and_length(copy);
        check_every_alignment_and_length(stream);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn both_store_widths_copy_every_alignment_and_length() {
        check_every_alignment_and_length(stream16);
        if std::is_x86_feature_detected!("avx") {
            /// `stream32` behind the feature check above.
            unsafe fn s32(d: *mut u8, s: &[u8]) {
                // SAFETY: the CPU has AVX (checked by the caller).
                unsafe { stream32(d, s) }
            }
            check_every_alignment_and_length(s32);
        }
    }
}
