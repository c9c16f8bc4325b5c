//! Durations as flags, environment variables and chart values write them: Go's `time.ParseDuration`
//! syntax (`30s`, `1m30s`, `500ms`, `1.5h`; units `ns`, `us`/`µs`, `ms`, `s`, `m`, `h`) plus `d` for
//! days (`7d`). One parser for the controller and the agent, so a value means the same everywhere.

use std::time::Duration;

/// Why a duration was refused; the message names the text and what is expected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("empty duration; expected e.g. 30s, 1m30s, 500ms, 7d")]
    Empty,
    #[error(
        "invalid duration {0:?}; expected a number and a unit each time, e.g. 30s, 1m30s, 500ms, 7d"
    )]
    Invalid(String),
    #[error("unknown unit {unit:?} in duration {text:?}; use ns, us, ms, s, m, h or d")]
    Unit { text: String, unit: String },
    #[error("duration {text:?} is longer than {max_days} days")]
    TooLong { text: String, max_days: u64 },
}

/// Parses `text` (see the module documentation), refusing anything longer than `max`. Never panics:
/// huge numbers are refused as too long.
pub fn parse_duration(text: &str, max: Duration) -> Result<Duration, DurationError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(DurationError::Empty);
    }
    let invalid = || DurationError::Invalid(text.to_string());
    let too_long = || DurationError::TooLong {
        text: text.to_string(),
        max_days: max.as_secs() / 86_400,
    };
    let mut total = 0f64;
    let mut rest = text;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(invalid)?;
        let number: f64 = rest[..number_len].parse().map_err(|_| invalid())?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "d" => 86_400.0,
            unit => {
                return Err(DurationError::Unit {
                    text: text.to_string(),
                    unit: unit.to_string(),
                });
            }
        };
        total += number * seconds;
        rest = &rest[unit_len..];
    }
    if total > max.as_secs_f64() {
        return Err(too_long());
    }
    // Within `max`, so finite and representable; rounding to nanoseconds may overshoot by one.
    Duration::try_from_secs_f64(total)
        .map(|d| d.min(max))
        .map_err(|_| too_long())
}

#[cfg(test)]
mod tests {
    use super::*;

    const YEAR: Duration = Duration::from_secs(366 * 86_400);

    #[test]
    fn go_durations_and_days() {
        let cases = [
            ("30s", Duration::from_secs(30)),
            ("1m30s", Duration::from_secs(90)),
            ("500ms", Duration::from_millis(500)),
            ("1.5h", Duration::from_secs(5400)),
            ("7d", Duration::from_secs(7 * 86_400)),
            ("1d12h", Duration::from_secs(36 * 3600)),
            ("250us", Duration::from_micros(250)),
            ("10ns", Duration::from_nanos(10)),
            (" 5m ", Duration::from_secs(300)),
            ("0s", Duration::ZERO),
            ("366d", YEAR),
        ];
        for (text, want) in cases {
            assert_eq!(parse_duration(text, YEAR), Ok(want), "{text}");
        }
    }

    /// Tells whether a refusal is of the expected kind.
    type IsExpected = fn(&DurationError) -> bool;

    #[test]
    fn refusals_name_the_problem() {
        let cases: [(&str, IsExpected); 9] = [
            ("", |e| matches!(e, DurationError::Empty)),
            ("30", |e| matches!(e, DurationError::Invalid(_))),
            ("s", |e| matches!(e, DurationError::Invalid(_))),
            ("1m30", |e| matches!(e, DurationError::Invalid(_))),
            ("-1s", |e| matches!(e, DurationError::Invalid(_))),
            ("1..5s", |e| matches!(e, DurationError::Invalid(_))),
            ("30x", |e| matches!(e, DurationError::Unit { .. })),
            ("367d", |e| matches!(e, DurationError::TooLong { .. })),
            ("99999999999999999999999999999999h", |e| {
                matches!(e, DurationError::TooLong { .. })
            }),
        ];
        for (text, expected) in cases {
            let err = parse_duration(text, YEAR).unwrap_err();
            assert!(expected(&err), "{text:?}: {err:?}");
        }
        assert!(
            parse_duration("367d", YEAR)
                .unwrap_err()
                .to_string()
                .contains("longer than 366 days")
        );
    }
}
