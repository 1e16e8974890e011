//! Which local ranks run a single-copy operation's work items when ranks
//! outnumber the processing units: one per CPU the ranks were seen on, so
//! that two workers never share a CPU while another sits idle, whatever
//! placement the scheduler chose.

/// The CPU the calling thread runs on, plus one (0 = unknown).
pub fn current_cpu() -> u64 {
    // SAFETY: sched_getcpu has no arguments; it returns -1 on failure.
    let c = unsafe { libc::sched_getcpu() };
    u64::try_from(c).map_or(0, |c| c + 1)
}

/// Whether local rank `me` is one of `workers` ranks chosen from `cpus`
/// (each rank's [`current_cpu`] at posting time): the lowest rank seen on
/// each CPU first, in rank order, then the lowest remaining ranks until
/// there are `workers`. Every rank computes the same set from the same
/// values; unknown CPUs (0) never count as distinct.
pub fn is_worker(cpus: &[u64], workers: usize, me: usize) -> bool {
    let n = cpus.len();
    if workers >= n {
        return true;
    }
    let first_on_cpu = |k: &usize| cpus[*k] != 0 && !cpus[..*k].contains(&cpus[*k]);
    let firsts = (0..n).filter(first_on_cpu);
    // Fewer distinct CPUs than workers: the lowest other ranks fill up.
    let others = (0..n).filter(|k| !first_on_cpu(k));
    firsts.chain(others).take(workers).any(|k| k == me)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(cpus: &[u64], workers: usize) -> Vec<usize> {
        (0..cpus.len())
            .filter(|&k| is_worker(cpus, workers, k))
            .collect()
    }

    #[test]
    fn one_worker_per_cpu() {
        assert_eq!(set(&[1, 1, 2, 2], 2), vec![0, 2]);
        assert_eq!(set(&[2, 1, 1, 2], 2), vec![0, 1]);
        assert_eq!(set(&[1, 2, 1, 2], 2), vec![0, 1]);
        assert_eq!(set(&[1, 1, 1, 2], 2), vec![0, 3]);
    }

    #[test]
    fn fills_up_when_cpus_repeat() {
        assert_eq!(set(&[1, 1, 1, 1], 2), vec![0, 1]);
        assert_eq!(set(&[0, 0, 0, 0], 2), vec![0, 1]);
        assert_eq!(set(&[0, 3, 0, 0], 2), vec![0, 1]);
        assert_eq!(set(&[0, 0, 3, 0], 2), vec![0, 2]);
    }

    #[test]
    fn everyone_when_workers_cover_ranks() {
        assert_eq!(set(&[1, 1, 1], 3), vec![0, 1, 2]);
        assert_eq!(set(&[1, 1, 1], 8), vec![0, 1, 2]);
    }

    #[test]
    fn exactly_workers_many() {
        for w in 1..6 {
            for cpus in [[1, 2, 3, 4, 5, 6], [1, 1, 2, 2, 3, 3], [0, 1, 0, 2, 2, 1]] {
                assert_eq!(set(&cpus, w).len(), w, "{cpus:?} {w}");
            }
        }
        assert_eq!(set(&[1, 2, 3, 1, 2, 3], 3), vec![0, 1, 2]);
        assert_eq!(set(&[1, 1, 2, 2, 3, 3], 3), vec![0, 2, 4]);
    }

    #[test]
    fn current_cpu_is_known_on_linux() {
        assert!(current_cpu() >= 1);
    }
}
