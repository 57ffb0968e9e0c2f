//! Sizes with suffixes: the one parser of byte and token counts for every strata tool.
//!
//! A size is a whole or decimal number, optionally followed by a unit `K`, `M`, `G` or
//! `T` (powers of 1024: 2^10, 2^20, 2^30, 2^40), which may carry an `i` and/or a `B`:
//! `4194304`, `4M`, `4Mi`, `4MiB`, `4MB`, `80G`, `80GiB`, `1.5G`, `512K`. Case does not
//! matter, and `MB` means 2^20 like `MiB`: this is nccl-tests' convention (`-b 8 -e
//! 128M`) and what `strata-plan --gpu-mem 80G` has always meant. A bare `B` (`512B`) is
//! bytes. The same parser reads token counts: `--global-batch-tokens 4M` is
//! 4,194,304 tokens, AMSP §VI-A3's "4 million tokens" batch (1024 sequences of 4096).
//!
//! Decimals are exact: the number is read as integer and fraction digits and scaled in
//! integer arithmetic, then rounded to the nearest whole unit (`1.5K` = 1536, `0.5` =
//! 1 by rounding half up; at most 18 fraction digits). Refused, with a message naming
//! the accepted forms: empty text, signs (`-1G`, `+1`), exponents (`1e9`), `NaN`, `inf`,
//! unknown units (`80X`, `80P`), anything above `u64::MAX`, and zero where the caller
//! asks for a positive size ([`parse_size`]; [`parse_size_or_zero`] accepts 0 for
//! flags where 0 means "none", such as `strata-plan --reserve 0`).

#![forbid(unsafe_code)]

/// The accepted forms, for error messages.
pub const SIZE_FORMS: &str = "a whole or decimal number, optionally followed by K, M, G or T \
(powers of 1024, with or without i/B: 4M = 4Mi = 4MiB = 4MB = 4194304), e.g. 4194304, 4M, 80G, 80GiB, 1.5G";

/// A size from `s` (module doc), zero allowed.
pub fn parse_size_or_zero(s: &str) -> Result<u64, String> {
    parse(s).ok_or_else(|| format!("'{s}' is not a size: give {SIZE_FORMS}"))
}

/// A positive size from `s` (module doc): zero is refused as well.
pub fn parse_size(s: &str) -> Result<u64, String> {
    match parse_size_or_zero(s)? {
        0 => Err(format!("'{s}' is zero: give a positive size, {SIZE_FORMS}")),
        v => Ok(v),
    }
}

/// `n` in the largest unit that divides it (`4M`, `80G`, `1536`):
/// the inverse of [`parse_size`] for whole units.
pub fn format_size(n: u64) -> String {
    for (unit, shift) in [("T", 40), ("G", 30), ("M", 20), ("K", 10)] {
        if n != 0 && n % (1u64 << shift) == 0 {
            return format!("{}{unit}", n >> shift);
        }
    }
    n.to_string()
}

fn strip(s: &str, c: char) -> (&str, bool) {
    match s.strip_suffix(c) {
        Some(r) => (r, true),
        None => (s, false),
    }
}

fn parse(s: &str) -> Option<u64> {
    let t = s.trim().to_ascii_lowercase();
    // Unit: [kmgt] [i] [b], or a bare b (bytes).
    let (rest, _) = strip(&t, 'b');
    let (rest, had_i) = strip(rest, 'i');
    let (num, shift) = match rest.chars().last() {
        Some('k') => (&rest[..rest.len() - 1], 10u32),
        Some('m') => (&rest[..rest.len() - 1], 20),
        Some('g') => (&rest[..rest.len() - 1], 30),
        Some('t') => (&rest[..rest.len() - 1], 40),
        // `4i` / `4ib` name no unit.
        _ if had_i => return None,
        _ => (rest, 0),
    };
    let num = num.trim_end();
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    let digits = |x: &str| x.bytes().all(|c| c.is_ascii_digit());
    if (int.is_empty() && frac.is_empty()) || !digits(int) || !digits(frac) || frac.len() > 18 {
        return None;
    }
    let mult = 1u128 << shift;
    let int_v: u128 = if int.is_empty() {
        0
    } else {
        int.parse::<u128>().ok()?
    };
    let mut v = int_v.checked_mul(mult)?;
    if !frac.is_empty() {
        let den = 10u128.pow(frac.len() as u32);
        let f: u128 = frac.parse().ok()?;
        // round half up: (f·mult + den/2) / den
        v = v.checked_add((f * mult + den / 2) / den)?;
    }
    u64::try_from(v).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_documented_forms() {
        for s in [
            "4194304", "4M", "4Mi", "4MiB", "4MB", "4m", "4mib", "4 M", " 4M ",
        ] {
            assert_eq!(parse_size(s), Ok(4 << 20), "{s}");
        }
        assert_eq!(parse_size("80G"), Ok(80 << 30));
        assert_eq!(parse_size("80GiB"), Ok(80 << 30));
        assert_eq!(parse_size("80gb"), Ok(80 << 30));
        assert_eq!(parse_size("85899345920"), Ok(80 << 30));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("1.5K"), Ok(1536));
        assert_eq!(parse_size("512B"), Ok(512));
        assert_eq!(parse_size("2T"), Ok(2 << 40));
        assert_eq!(parse_size(".5K"), Ok(512));
        assert_eq!(parse_size("3."), Ok(3));
        assert_eq!(parse_size("0.5"), Ok(1)); // rounds half up
        assert_eq!(parse_size(&u64::MAX.to_string()), Ok(u64::MAX));
    }

    #[test]
    fn refusals_name_the_forms() {
        for bad in [
            "",
            " ",
            "G",
            "B",
            "iB",
            "-1G",
            "+1",
            "1e9",
            "NaN",
            "nan",
            "inf",
            "80X",
            "80P",
            "4i",
            "4ib",
            "1.2.3",
            ".",
            "1,5G",
            "16777216T",
            "18446744073709551616",
            "0.0000000000000000001",
        ] {
            let e = parse_size_or_zero(bad).err();
            let e = e.or_else(|| parse_size(bad).err());
            let e = e.unwrap_or_else(|| panic!("{bad:?} accepted"));
            assert!(e.contains("4MiB") && e.contains("powers of 1024"), "{e}");
        }
        assert_eq!(parse_size_or_zero("0"), Ok(0));
        assert_eq!(parse_size_or_zero("0G"), Ok(0));
        assert!(parse_size("0").unwrap_err().contains("zero"));
        assert!(parse_size("0.0001").unwrap_err().contains("zero"));
    }

    #[test]
    fn format_inverts_whole_units() {
        assert_eq!(format_size(4 << 20), "4M");
        assert_eq!(format_size(80 << 30), "80G");
        assert_eq!(format_size(1536), "1536");
        assert_eq!(format_size(0), "0");
    }

    proptest! {
        #[test]
        fn every_unit_spelling_agrees(n in 0u64..(1 << 23), unit in 0usize..5, i in any::<bool>(), b in any::<bool>(), upper in any::<bool>()) {
            let (u, shift) = [("", 0), ("k", 10), ("m", 20), ("g", 30), ("t", 40)][unit];
            let mut s = format!("{n}{u}{}{}", if i && !u.is_empty() { "i" } else { "" }, if b { "b" } else { "" });
            if upper {
                s = s.to_ascii_uppercase();
            }
            prop_assert_eq!(parse_size_or_zero(&s), Ok(n << shift));
            prop_assert_eq!(parse_size_or_zero(&format_size(n << shift)), Ok(n << shift));
        }

        #[test]
        fn decimals_are_exact(whole in 0u64..1000, tenths in 0u64..10) {
            let s = format!("{whole}.{tenths}M");
            let want = whole * (1 << 20) + (tenths * (1 << 20) + 5) / 10;
            prop_assert_eq!(parse_size_or_zero(&s), Ok(want));
        }

        #[test]
        fn never_panics(s in "\\PC{0,12}") {
            let _ = parse_size(&s);
        }
    }
}
