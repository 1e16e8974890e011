//! [`Few`]: a list that holds its first element inline, for the per-call
//! lists of the executor's entry (communicators, their jobs, locks and
//! batches), which hold one element in every call outside a group.

/// A list of usually one element: no allocation until a second arrives.
#[derive(Debug, Default)]
pub(super) enum Few<T> {
    /// No element yet.
    #[default]
    Empty,
    /// One element, inline.
    One(T),
    /// More than one.
    Many(Vec<T>),
}

impl<T> Few<T> {
    /// The elements.
    pub fn as_slice(&self) -> &[T] {
        match self {
            Self::Empty => &[],
            Self::One(t) => std::slice::from_ref(t),
            Self::Many(v) => v,
        }
    }

    /// The elements, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        match self {
            Self::Empty => &mut [],
            Self::One(t) => std::slice::from_mut(t),
            Self::Many(v) => v,
        }
    }

    /// An empty list with room for `n` elements (inline for one).
    pub fn with_capacity(n: usize) -> Self {
        if n > 1 {
            Self::Many(Vec::with_capacity(n))
        } else {
            Self::Empty
        }
    }

    /// Inserts `t` at `at` (at most the length), shifting the rest.
    pub fn insert(&mut self, at: usize, t: T) {
        match std::mem::take(self) {
            Self::Empty => *self = Self::One(t),
            Self::One(u) => {
                let mut v = Vec::with_capacity(2);
                v.push(u);
                v.insert(at, t);
                *self = Self::Many(v);
            }
            Self::Many(mut v) => {
                v.insert(at, t);
                *self = Self::Many(v);
            }
        }
    }

    /// Appends `t`.
    pub fn push(&mut self, t: T) {
        let at = self.as_slice().len();
        self.insert(at, t);
    }

    /// The elements by value, in order.
    pub fn into_vec_iter(self) -> impl Iterator<Item = T> {
        let (one, many) = match self {
            Self::Empty => (None, Vec::new()),
            Self::One(t) => (Some(t), Vec::new()),
            Self::Many(v) => (None, v),
        };
        one.into_iter().chain(many)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_one_inline_and_keeps_order_past_it() {
        let mut f = Few::default();
        assert!(f.as_slice().is_empty());
        f.push(2);
        assert!(matches!(f, Few::One(2)));
        f.insert(0, 1);
        f.push(4);
        f.insert(2, 3);
        assert_eq!(f.as_slice(), &[1, 2, 3, 4]);
        f.as_mut_slice()[0] = 0;
        assert_eq!(f.into_vec_iter().collect::<Vec<_>>(), vec![0, 2, 3, 4]);
        let mut m = Few::with_capacity(3);
        m.push(1);
        assert!(
            matches!(&m, Few::Many(v) if v.capacity() >= 3),
            "room reserved"
        );
        assert!(matches!(Few::<u8>::with_capacity(1), Few::Empty));
        let mut g = Few::default();
        g.insert(0, 'a');
        g.insert(0, 'b');
        assert_eq!(g.as_slice(), &['b', 'a']);
    }
}
