//! The clock of metrics and the timeline: the CPU's time-stamp counter
//! where it is invariant (x86-64), else the monotonic clock in nanoseconds.
//! Ticks become nanoseconds through a factor calibrated against the
//! monotonic clock at [`init`] and refined by [`calibrate`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use once_cell::sync::Lazy;

/// Whether [`ticks`] reads the time-stamp counter.
static TSC: AtomicBool = AtomicBool::new(false);
/// Nanoseconds per tick, as 32.32 fixed point.
static NS_PER_TICK: AtomicU64 = AtomicU64::new(1 << 32);

/// The reference point: an instant, the ticks then, and the Unix time then.
struct Epoch {
    at: Instant,
    ticks: u64,
    unix_ns: u64,
}

static EPOCH: Lazy<Epoch> = Lazy::new(|| {
    let tsc = tsc_invariant();
    TSC.store(tsc, Ordering::Relaxed);
    let at = Instant::now();
    // The monotonic fallback counts from this instant, so it starts at 0.
    let ticks = if tsc { raw_tsc() } else { 0 };
    let unix_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    Epoch { at, ticks, unix_ns }
});

/// Whether the CPU has an invariant time-stamp counter.
fn tsc_invariant() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // cpuid is safe on every x86-64 CPU; leaf 0x80000000 gives the
        // highest extended leaf, checked before 0x80000007.
        let max = core::arch::x86_64::__cpuid(0x8000_0000).eax;
        max >= 0x8000_0007 && core::arch::x86_64::__cpuid(0x8000_0007).edx & (1 << 8) != 0
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The time-stamp counter (0 where there is none).
#[inline]
fn raw_tsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc has no preconditions on x86-64.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        0
    }
}

/// The current tick count: cheap (no system call, no lock). Meaningful
/// once [`init`] ran.
#[inline]
pub fn ticks() -> u64 {
    if TSC.load(Ordering::Relaxed) {
        return raw_tsc();
    }
    mono_ns()
}

/// Nanoseconds of the monotonic clock since the epoch.
fn mono_ns() -> u64 {
    Lazy::force(&EPOCH).at.elapsed().as_nanos() as u64
}

/// Sets the clock up (once per process; later calls only refine the
/// calibration): spins for about a millisecond the first time.
pub fn init() {
    static FIRST: std::sync::Once = std::sync::Once::new();
    FIRST.call_once(|| {
        Lazy::force(&EPOCH);
        let until = Instant::now() + Duration::from_millis(1);
        while Instant::now() < until {
            std::hint::spin_loop();
        }
    });
    calibrate();
}

/// Refines the ticks-to-nanoseconds factor over the time since the epoch.
pub fn calibrate() {
    let e = Lazy::force(&EPOCH);
    if !TSC.load(Ordering::Relaxed) {
        return;
    }
    let (t, ns) = (ticks(), e.at.elapsed().as_nanos() as u64);
    let dt = t.wrapping_sub(e.ticks);
    if dt > 0 && ns > 0 {
        let f = ((u128::from(ns) << 32) / u128::from(dt)).min(u128::from(u64::MAX));
        NS_PER_TICK.store(f as u64, Ordering::Relaxed);
    }
}

/// A tick interval in nanoseconds.
#[inline]
pub fn to_ns(dticks: u64) -> u64 {
    ((u128::from(dticks) * u128::from(NS_PER_TICK.load(Ordering::Relaxed))) >> 32) as u64
}

/// Nanoseconds since the epoch of a tick count.
pub fn since_epoch_ns(t: u64) -> u64 {
    to_ns(t.saturating_sub(Lazy::force(&EPOCH).ticks))
}

/// The Unix time (ns) of a tick count, on this host's clock.
pub fn unix_ns(t: u64) -> u64 {
    Lazy::force(&EPOCH).unix_ns + since_epoch_ns(t)
}

/// The Unix time now (ns), on the same scale as [`unix_ns`].
pub fn now_unix_ns() -> u64 {
    unix_ns(ticks())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_convert_to_elapsed_time() {
        init();
        let (t0, i0) = (ticks(), Instant::now());
        std::thread::sleep(Duration::from_millis(20));
        let (t1, i1) = (ticks(), Instant::now());
        calibrate();
        let ns = to_ns(t1 - t0) as f64;
        let real = (i1 - i0).as_nanos() as f64;
        assert!((ns - real).abs() < real * 0.05, "{ns} vs {real}");
        assert!(now_unix_ns() > 1_600_000_000_000_000_000);
    }
}
