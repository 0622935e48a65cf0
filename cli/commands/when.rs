//! Times and ages as people type them: `--since 2h`, `--since 2026-11-01`, `--older-than 30d`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// An age as it was written, and how long it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Age {
    pub text: String,
    pub duration: Duration,
}

/// An age: a duration such as `30d`, `12h` or `2w`.
pub fn parse_age(text: &str) -> Result<Age, String> {
    let text = text.trim();
    humantime::parse_duration(text)
        .map(|duration| Age {
            text: text.to_owned(),
            duration,
        })
        .map_err(|_| format!("`{text}` is not an age such as `30d`, `12h` or `2w`"))
}

/// A point in time, in milliseconds since the epoch: a duration back from now (`2h`), a date
/// (`2026-11-01`, midnight UTC) or a time (`2026-11-01T09:30:00Z`, UTC when no offset is written).
pub fn parse_since(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let at = if let Ok(age) = humantime::parse_duration(text) {
        SystemTime::now().checked_sub(age).unwrap_or(UNIX_EPOCH)
    } else if text.len() == 10 {
        humantime::parse_rfc3339(&format!("{text}T00:00:00Z")).map_err(|_| problem(text))?
    } else {
        humantime::parse_rfc3339_weak(text).map_err(|_| problem(text))?
    };
    Ok(at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64))
}

fn problem(text: &str) -> String {
    format!(
        "`{text}` is not a duration (`2h`), a date (`2026-11-01`) or a time (`2026-11-01T09:30:00Z`)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_times_are_utc_and_durations_count_back_from_now() {
        assert_eq!(parse_since("2026-11-01"), Ok(1_793_491_200_000));
        assert_eq!(parse_since("2026-11-01T09:30:00Z"), Ok(1_793_525_400_000));
        assert_eq!(parse_since("2026-11-01 09:30:00"), Ok(1_793_525_400_000));
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_millis() as u64;
        let two_hours_ago = parse_since("2h").expect("a duration");
        assert!((now - 7_200_000..=now - 7_100_000).contains(&two_hours_ago));
        assert_eq!(
            parse_since("yesterday"),
            Err("`yesterday` is not a duration (`2h`), a date (`2026-11-01`) or a time (`2026-11-01T09:30:00Z`)".to_owned())
        );
        assert_eq!(
            parse_age("30d").map(|a| a.duration),
            Ok(Duration::from_secs(30 * 86_400))
        );
        assert!(parse_age("soon").is_err());
    }
}
