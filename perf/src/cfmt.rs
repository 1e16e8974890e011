//! The few printf conversions nccl-tests' output uses (`%.Nf` in a width,
//! `%.Ne`, `%g`), reproduced exactly.

/// C's `%.{prec}e`: mantissa, `e`, sign, at least two exponent digits.
pub fn c_exp(v: f64, prec: usize) -> String {
    if !v.is_finite() {
        return c_nonfinite(v);
    }
    let s = format!("{:.*e}", prec, v);
    let (mant, exp) = s.split_once('e').expect("rust {:e} has an exponent");
    let exp: i32 = exp.parse().expect("exponent is an integer");
    let sign = if exp < 0 { '-' } else { '+' };
    format!("{mant}e{sign}{:02}", exp.abs())
}

fn c_nonfinite(v: f64) -> String {
    if v.is_nan() {
        "nan".into()
    } else if v > 0.0 {
        "inf".into()
    } else {
        "-inf".into()
    }
}

/// C's `%g` (precision 6): `%e` or `%f` by the exponent, trailing zeros
/// removed.
pub fn c_g(v: f64) -> String {
    if !v.is_finite() {
        return c_nonfinite(v);
    }
    if v == 0.0 {
        return if v.is_sign_negative() {
            "-0".into()
        } else {
            "0".into()
        };
    }
    const P: i32 = 6;
    let e = format!("{:.*e}", (P - 1) as usize, v);
    let x: i32 = e.split_once('e').expect("exponent").1.parse().expect("int");
    if !(-4..P).contains(&x) {
        let s = c_exp(v, (P - 1) as usize);
        let (m, ex) = s.split_once('e').expect("exponent");
        format!("{}e{}", strip_zeros(m), ex)
    } else {
        let s = format!("{:.*}", (P - 1 - x) as usize, v);
        strip_zeros(&s).to_string()
    }
}

fn strip_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

/// nccl-tests' `getFloatStr`: the value right-aligned in `width` with 2, 1
/// or 0 decimals, whichever fits first, else in exponent form.
pub fn float_str(v: f64, width: usize) -> String {
    for prec in [2usize, 1, 0] {
        let s = if v.is_finite() {
            format!("{:>w$.p$}", v, w = width, p = prec)
        } else {
            c_nonfinite(v)
        };
        if s.len() <= width {
            return format!("{s:>width$}");
        }
    }
    let s = c_exp(v, if width >= 7 { 1 } else { 0 });
    // snprintf truncates to the buffer, like nccl-tests.
    let s = format!("{s:>width$}");
    s.chars().take(width).collect()
}
