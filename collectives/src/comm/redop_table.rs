//! The PreMulSum ops a communicator created with `ncclRedOpCreatePreMulSum`.

use hetccl_abi::redop::{NCCL_MAX_RED_OP, NCCL_NUM_OPS};
use hetccl_abi::{DataType, ScalarResidence};

use crate::error::{Error, Result};

/// Where a PreMulSum scalar comes from when the collective runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    /// Read at creation (`ncclScalarHostImmediate`): the value's bytes,
    /// little-endian, `dtype.size()` of them used.
    Immediate([u8; 8]),
    /// Read when the collective runs (`ncclScalarDevice`): an address that
    /// the caller keeps valid.
    Pointer(usize),
}

/// One dynamic reduction op.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PreMulSum {
    /// The element type the op was created for.
    pub dtype: DataType,
    /// The scalar.
    pub scalar: Scalar,
}

/// The table of dynamic ops: op value `NCCL_NUM_OPS + i` is slot `i`.
#[derive(Debug, Default)]
pub struct RedOpTable {
    slots: Vec<Option<PreMulSum>>,
}

/// The most dynamic ops one comm may hold at once.
pub const MAX_DYNAMIC_OPS: usize = 1 << 16;

impl RedOpTable {
    /// Creates an op and returns its raw `ncclRedOp_t` value.
    ///
    /// # Safety
    /// For [`ScalarResidence::HostImmediate`], `scalar` must point to at least
    /// `dtype.size()` readable bytes.
    pub unsafe fn create(
        &mut self,
        scalar: *const u8,
        dtype: DataType,
        residence: ScalarResidence,
    ) -> Result<i32> {
        if scalar.is_null() {
            return Err(Error::arg("scalar is NULL"));
        }
        let scalar = match residence {
            ScalarResidence::HostImmediate => {
                let mut b = [0u8; 8];
                // SAFETY: the caller guarantees dtype.size() readable bytes.
                unsafe { std::ptr::copy_nonoverlapping(scalar, b.as_mut_ptr(), dtype.size()) };
                Scalar::Immediate(b)
            }
            ScalarResidence::Device => Scalar::Pointer(scalar as usize),
        };
        let op = PreMulSum { dtype, scalar };
        let idx = match self.slots.iter().position(Option::is_none) {
            Some(i) => {
                self.slots[i] = Some(op);
                i
            }
            None if self.slots.len() < MAX_DYNAMIC_OPS => {
                self.slots.push(Some(op));
                self.slots.len() - 1
            }
            None => {
                return Err(Error::usage(format!(
                    "too many live PreMulSum ops (limit {MAX_DYNAMIC_OPS})"
                )))
            }
        };
        let raw = NCCL_NUM_OPS as usize + idx;
        debug_assert!(raw <= NCCL_MAX_RED_OP as usize);
        Ok(raw as i32)
    }

    fn index(raw: i32) -> Result<usize> {
        if raw < NCCL_NUM_OPS {
            return Err(Error::arg(format!(
                "op {raw} is a built-in op, not a PreMulSum op"
            )));
        }
        Ok((raw - NCCL_NUM_OPS) as usize)
    }

    /// Looks up a live op.
    pub fn get(&self, raw: i32) -> Result<PreMulSum> {
        let i = Self::index(raw)?;
        self.slots
            .get(i)
            .copied()
            .flatten()
            .ok_or_else(|| Error::arg(format!("op {raw} is not a live op of this communicator")))
    }

    /// Destroys a live op; its value may be reused by a later create.
    pub fn destroy(&mut self, raw: i32) -> Result<()> {
        self.get(raw)?;
        self.slots[Self::index(raw)?] = None;
        Ok(())
    }

    /// The number of live ops.
    pub fn live(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_get_destroy_reuse() {
        let mut t = RedOpTable::default();
        let v = 2.5f32;
        // SAFETY: `v` is a live f32, the scalar of its type.
        let a = unsafe {
            t.create(
                &v as *const f32 as *const u8,
                DataType::Float32,
                ScalarResidence::HostImmediate,
            )
        }
        .unwrap();
        assert_eq!(a, 5);
        // SAFETY: `v` is a live f32, the scalar of its type.
        let b = unsafe {
            t.create(
                &v as *const f32 as *const u8,
                DataType::Float32,
                ScalarResidence::Device,
            )
        }
        .unwrap();
        assert_eq!(b, 6);
        let got = t.get(a).unwrap();
        assert_eq!(
            got.scalar,
            Scalar::Immediate([0, 0, 0x20, 0x40, 0, 0, 0, 0])
        );
        assert!(matches!(t.get(b).unwrap().scalar, Scalar::Pointer(_)));
        t.destroy(a).unwrap();
        assert!(t.destroy(a).is_err(), "double destroy");
        assert!(t.get(a).is_err());
        assert!(t.destroy(0).is_err(), "built-in op");
        assert!(t.destroy(99).is_err(), "never created");
        // SAFETY: `v` is a live f32, the scalar of its type.
        let c = unsafe {
            t.create(
                &v as *const f32 as *const u8,
                DataType::Float32,
                ScalarResidence::HostImmediate,
            )
        }
        .unwrap();
        assert_eq!(c, a, "freed ids are reused");
        assert_eq!(t.live(), 2);
        assert!(
            // SAFETY: a NULL scalar, which `create` refuses.
            unsafe { t.create(std::ptr::null(), DataType::Int8, ScalarResidence::Device) }.is_err()
        );
    }
}
