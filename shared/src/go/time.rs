//! The calendar fields of a Unix time in UTC, for the timestamps Go's `time` package prints
//! (`Time.String()`, RFC 3339) and for dates in file names.

use std::time::SystemTime;

/// A time's UTC calendar date and time of day. Times before 1970 read as 1970-01-01.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Utc {
    pub year: i64,
    pub month: u32,
    pub day: u32,
    pub hour: u64,
    pub minute: u64,
    pub second: u64,
    pub millis: u32,
}

impl Utc {
    pub fn of(t: SystemTime) -> Utc {
        let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        let secs = since.as_secs();
        let rem = secs % 86_400;
        let (year, month, day) = civil_from_days(i64::try_from(secs / 86_400).unwrap_or(0));
        Utc {
            year,
            month,
            day,
            hour: rem / 3600,
            minute: rem % 3600 / 60,
            second: rem % 60,
            millis: since.subsec_millis(),
        }
    }

    /// `YYYY-MM-DD`.
    pub fn date(&self) -> String {
        format!("{:04}-{:02}-{:02}", self.year, self.month, self.day)
    }
}

/// `2026-11-24T03:40:10.123Z`: a UTC time in RFC 3339 to the millisecond, as log lines print it.
pub fn rfc3339_millis(t: SystemTime) -> String {
    let u = Utc::of(t);
    format!(
        "{}T{:02}:{:02}:{:02}.{:03}Z",
        u.date(),
        u.hour,
        u.minute,
        u.second,
        u.millis
    )
}

/// Days since 1970-01-01 to a (year, month, day) of the proleptic Gregorian calendar
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = u32::try_from(doy - (153 * mp + 2) / 5 + 1).unwrap_or(1);
    let month = u32::try_from(if mp < 10 { mp + 3 } else { mp - 9 }).unwrap_or(1);
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn rfc3339_has_milliseconds() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_763_955_610_007);
        assert_eq!(rfc3339_millis(t), "2025-11-24T03:40:10.007Z");
    }

    #[test]
    fn days_since_the_epoch_are_calendar_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_000), (2024, 10, 4));
        assert_eq!(civil_from_days(20_781), (2026, 11, 24));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
    }

    #[test]
    fn a_time_splits_into_its_utc_fields() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(20_781 * 86_400_000 + 13_570_123);
        let utc = Utc::of(t);
        assert_eq!(
            utc,
            Utc {
                year: 2026,
                month: 11,
                day: 24,
                hour: 3,
                minute: 46,
                second: 10,
                millis: 123,
            }
        );
        assert_eq!(utc.date(), "2026-11-24");
        assert_eq!(Utc::of(SystemTime::UNIX_EPOCH).date(), "1970-01-01");
    }
}
