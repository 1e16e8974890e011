//! Argument checks shared by the exported functions. Each returns
//! [`Error::InvalidArgument`] with a message that names the argument.

use hetccl_abi::{DataType, RedOp};

use crate::error::{Error, Result};

/// Fails if `p` is NULL.
pub fn non_null<T>(p: *const T, what: &str) -> Result<()> {
    if p.is_null() {
        Err(Error::arg(format!("{what} is NULL")))
    } else {
        Ok(())
    }
}

/// Converts a raw `ncclDataType_t`.
#[inline]
pub fn datatype(raw: i32) -> Result<DataType> {
    DataType::try_from(raw).map_err(bad_datatype)
}

#[cold]
#[inline(never)]
fn bad_datatype(v: i32) -> Error {
    Error::arg(format!("invalid datatype {v}"))
}

/// Converts a raw `ncclRedOp_t` (built-in or dynamic id; whether a dynamic id
/// is live is checked against the comm's op table).
pub fn redop(raw: i32) -> Result<RedOp> {
    RedOp::try_from(raw).map_err(|v| Error::arg(format!("invalid reduction operation {v}")))
}

/// The byte size of `count` elements of `dt`, or an error on overflow
/// (bounded by `isize::MAX`, the most any buffer can hold).
#[inline(always)]
pub fn bytes(count: usize, dt: DataType, what: &str) -> Result<usize> {
    match dt.bytes(count) {
        Some(b) if b <= isize::MAX as usize => Ok(b),
        _ => Err(too_many(count, dt, what)),
    }
}

#[cold]
#[inline(never)]
fn too_many(count: usize, dt: DataType, what: &str) -> Error {
    Error::arg(format!(
        "{what} of {count} {} elements overflows the address space",
        dt.name()
    ))
}

/// `count * nranks * size(dt)` bytes, checked.
pub fn bytes_times(count: usize, nranks: usize, dt: DataType, what: &str) -> Result<usize> {
    let total = count
        .checked_mul(nranks)
        .ok_or_else(|| Error::arg(format!("{what}: {count} x {nranks} elements overflows")))?;
    bytes(total, dt, what)
}

/// Fails unless `0 <= rank < nranks`.
#[inline]
pub fn rank_in(rank: i32, nranks: i32, what: &str) -> Result<usize> {
    if rank < 0 || rank >= nranks {
        Err(out_of_range(rank, nranks, what))
    } else {
        Ok(rank as usize)
    }
}

#[cold]
#[inline(never)]
fn out_of_range(rank: i32, nranks: i32, what: &str) -> Error {
    Error::arg(format!("{what} {rank} is out of range [0, {nranks})"))
}

/// Fails if a buffer of `bytes` > 0 is NULL.
#[inline]
pub fn buffer<T>(p: *const T, bytes: usize, what: &str) -> Result<()> {
    if bytes > 0 && p.is_null() {
        Err(null_buffer(bytes, what))
    } else {
        Ok(())
    }
}

#[cold]
#[inline(never)]
fn null_buffer(bytes: usize, what: &str) -> Error {
    Error::arg(format!(
        "{what} is NULL but {bytes} bytes are to be accessed"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks() {
        assert!(non_null(std::ptr::null::<u8>(), "x").is_err());
        assert!(datatype(12).is_err());
        assert!(redop(-2).is_err());
        assert!(bytes(usize::MAX / 2, DataType::Float32, "sendbuff").is_err());
        assert_eq!(bytes(3, DataType::Float64, "b").unwrap(), 24);
        assert!(bytes_times(usize::MAX / 3, 4, DataType::Int8, "b").is_err());
        assert!(rank_in(3, 3, "root").is_err());
        assert!(rank_in(-1, 3, "root").is_err());
        assert_eq!(rank_in(2, 3, "root").unwrap(), 2);
        assert!(buffer(std::ptr::null::<u8>(), 0, "b").is_ok());
        assert!(buffer(std::ptr::null::<u8>(), 1, "b").is_err());
    }
}
