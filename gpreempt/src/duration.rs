//! The one duration syntax of the command line and the agent's configuration: a number and a
//! unit (`200us`, `0.5ms`, `20ms`, `1s`, `5m`), no space. A bare number is refused, naming the
//! unit the flag's old spelling used (`--hold 20` → "write 20ms"), so nobody gets seconds where
//! they meant milliseconds.
//! The deprecated flags (`--hold-ms 20`) keep their bare numbers: [`in_unit`].

use std::time::Duration;

/// The units, as written after the number, and their length in nanoseconds.
const UNITS: [(&str, f64); 7] =
    [("ns", 1.0), ("us", 1e3), ("µs", 1e3), ("ms", 1e6), ("s", 1e9), ("m", 60e9), ("h", 3600e9)];

/// What the error messages list.
pub const UNIT_LIST: &str = "ns, us (or µs), ms, s, m, h";

/// A value parser for clap: `text` as a duration with a unit; a bare number is refused with a
/// hint to write it with `hint` (the unit the flag is usually given in).
pub fn with_unit(hint: &'static str) -> impl Fn(&str) -> Result<Duration, String> + Clone + Send + Sync + 'static {
    move |text| parse(text, hint)
}

/// `text` (`20ms`, `0.5ms`, `200us`, `1.5s`) as a [`Duration`]; a bare number is an error that
/// suggests `hint` (`20` → "write 20ms").
pub fn parse(text: &str, hint: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    if number.is_empty() {
        return Err(format!("`{text}` is not a duration: write a number and a unit, e.g. 20{hint} ({UNIT_LIST})"));
    }
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration: write a number and a unit, e.g. 20{hint} ({UNIT_LIST})"))?;
    if unit.is_empty() {
        return Err(format!("`{text}` has no unit: write {text}{hint} (units: {UNIT_LIST})"));
    }
    let Some((_, ns)) = UNITS.iter().find(|(u, _)| *u == unit) else {
        return Err(format!("unknown unit `{unit}` in `{text}` (use {UNIT_LIST})"));
    };
    Duration::try_from_secs_f64(value * ns / 1e9).map_err(|e| format!("`{text}`: {e}"))
}

/// A value parser for the deprecated flags that took a bare number in `unit` (`--hold-ms 20`,
/// `--idle-ms 0.5`).
pub fn in_unit(unit: &'static str) -> impl Fn(&str) -> Result<Duration, String> + Clone + Send + Sync + 'static {
    move |text| {
        let text = text.trim();
        let value: f64 = text.parse().map_err(|_| format!("`{text}` is not a number of {unit}"))?;
        let ns = UNITS.iter().find(|(u, _)| *u == unit).map_or(1e6, |(_, ns)| *ns);
        if value < 0.0 {
            return Err(format!("`{text}` is negative"));
        }
        Duration::try_from_secs_f64(value * ns / 1e9).map_err(|e| format!("`{text}`: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit_parses() {
        let p = |t: &str| parse(t, "ms");
        assert_eq!(p("1500ns"), Ok(Duration::from_nanos(1500)));
        assert_eq!(p("200us"), Ok(Duration::from_micros(200)));
        assert_eq!(p("200µs"), Ok(Duration::from_micros(200)));
        assert_eq!(p("20ms"), Ok(Duration::from_millis(20)));
        assert_eq!(p("0.5ms"), Ok(Duration::from_micros(500)));
        assert_eq!(p("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(p("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(p("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(p("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(p(" 30s "), Ok(Duration::from_secs(30)));
        assert_eq!(p("0ms"), Ok(Duration::ZERO));
    }

    #[test]
    fn a_bare_number_is_refused_with_the_unit_to_add() {
        assert_eq!(parse("20", "ms"), Err("`20` has no unit: write 20ms (units: ns, us (or µs), ms, s, m, h)".into()));
        assert_eq!(
            parse("200", "us"),
            Err("`200` has no unit: write 200us (units: ns, us (or µs), ms, s, m, h)".into())
        );
        assert_eq!(
            parse("0.5", "s").unwrap_err(),
            "`0.5` has no unit: write 0.5s (units: ns, us (or µs), ms, s, m, h)"
        );
    }

    #[test]
    fn nonsense_is_refused() {
        assert_eq!(parse("3d", "ms"), Err("unknown unit `d` in `3d` (use ns, us (or µs), ms, s, m, h)".into()));
        assert_eq!(parse("20 ms", "ms"), Err("unknown unit ` ms` in `20 ms` (use ns, us (or µs), ms, s, m, h)".into()));
        assert_eq!(
            parse("soon", "s"),
            Err("`soon` is not a duration: write a number and a unit, e.g. 20s (ns, us (or µs), ms, s, m, h)".into())
        );
        assert!(parse("", "s").is_err());
        assert!(parse("-5ms", "ms").is_err());
        assert!(parse("1.2.3ms", "ms").is_err());
        assert!(parse("1e400s", "ms").is_err());
    }

    #[test]
    fn old_flags_take_bare_numbers_in_their_unit() {
        assert_eq!(in_unit("ms")("20"), Ok(Duration::from_millis(20)));
        assert_eq!(in_unit("ms")("0.5"), Ok(Duration::from_micros(500)));
        assert_eq!(in_unit("us")("200"), Ok(Duration::from_micros(200)));
        assert_eq!(in_unit("ms")("20ms"), Err("`20ms` is not a number of ms".into()));
        assert_eq!(in_unit("ms")("-1"), Err("`-1` is negative".into()));
    }
}
