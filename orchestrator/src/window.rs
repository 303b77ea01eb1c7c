//! Maintenance windows: when fleet upgrades may start a tenant (pure).
//!
//! A window is set on a plan (`render::Plan::maintenance_window`) or on a tenant (the API's
//! `maintenance_window`, stored in the inventory as JSON); the tenant's own wins. The fleet
//! planner ([`crate::lifecycle::fleet`]) asks [`MaintenanceWindow::contains`] and
//! [`MaintenanceWindow::next_open`] whether to start a tenant now or when to wake up. The CLI
//! reads the text form (`sat,sun 02:00 4h`, [`FromStr`]), the API the JSON form
//! ([`RawWindow`], checked when read).
//!
//! A module of its own so that plans (`render`) and fleet upgrades (`upgrade`) both depend on
//! it, one way, instead of on each other.

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;
use time::{OffsetDateTime, Weekday};

/// The longest maintenance window: a day (a window may cross midnight).
pub const MAX_WINDOW_MINUTES: u32 = 1440;

/// A day of the week, as maintenance windows name them.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Day {
    Mon,
    Tue,
    Wed,
    Thu,
    Fri,
    Sat,
    Sun,
}

impl Day {
    pub const ALL: [Day; 7] = [
        Day::Mon,
        Day::Tue,
        Day::Wed,
        Day::Thu,
        Day::Fri,
        Day::Sat,
        Day::Sun,
    ];

    fn weekday(self) -> Weekday {
        match self {
            Day::Mon => Weekday::Monday,
            Day::Tue => Weekday::Tuesday,
            Day::Wed => Weekday::Wednesday,
            Day::Thu => Weekday::Thursday,
            Day::Fri => Weekday::Friday,
            Day::Sat => Weekday::Saturday,
            Day::Sun => Weekday::Sunday,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Day::Mon => "mon",
            Day::Tue => "tue",
            Day::Wed => "wed",
            Day::Thu => "thu",
            Day::Fri => "fri",
            Day::Sat => "sat",
            Day::Sun => "sun",
        }
    }
}

/// When fleet upgrades may start a tenant: opening on each of `days` at `start` (UTC) and
/// lasting `duration_minutes` (a window may run past midnight into the next day). A tenant
/// outside its window waits; one already started finishes whenever it finishes.
///
/// Its JSON form is [`RawWindow`] (checked when read, so a stored or requested window that
/// breaks a rule never becomes one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawWindow", into = "RawWindow")]
pub struct MaintenanceWindow {
    days: BTreeSet<Day>,
    /// Minutes after midnight UTC.
    start: u32,
    duration: u32,
}

/// A maintenance window (the JSON form of [`MaintenanceWindow`]): fleet upgrades start a
/// tenant only while it is open, from `start` (UTC) on each of `days`, for
/// `duration_minutes` (it may run past midnight).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = MaintenanceWindow)]
pub struct RawWindow {
    /// The days it opens on (UTC): one to seven of `mon` .. `sun`.
    #[schema(min_items = 1, max_items = 7)]
    pub days: Vec<Day>,
    /// When it opens, `HH:MM` in UTC (24-hour clock).
    #[schema(pattern = r"^([01][0-9]|2[0-3]):[0-5][0-9]$", example = "02:00")]
    pub start: String,
    /// How long it stays open, 1 to 1440 minutes.
    #[schema(minimum = 1, maximum = 1440, example = 240)]
    #[serde(deserialize_with = "whole_number")]
    pub duration_minutes: u32,
}

/// Why a maintenance window does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WindowError {
    #[error("a maintenance window opens on one to seven days")]
    NoDays,
    #[error("{0:?} is not a time like 02:00 (UTC, 24-hour clock)")]
    Start(String),
    #[error("a maintenance window lasts 1 to {MAX_WINDOW_MINUTES} minutes, not {0}")]
    Duration(u32),
    #[error("{0:?} is not a day (mon, tue, wed, thu, fri, sat, sun, daily, weekdays, weekends)")]
    Day(String),
    #[error(
        "{0:?} is not a maintenance window like \"sat,sun 02:00 4h\" (days, start in UTC, duration)"
    )]
    Text(String),
}

impl TryFrom<RawWindow> for MaintenanceWindow {
    type Error = WindowError;

    fn try_from(r: RawWindow) -> Result<MaintenanceWindow, WindowError> {
        if r.days.len() > Day::ALL.len() {
            return Err(WindowError::NoDays);
        }
        let days: BTreeSet<Day> = r.days.into_iter().collect();
        if days.is_empty() {
            return Err(WindowError::NoDays);
        }
        let start = parse_clock(&r.start).ok_or(WindowError::Start(r.start))?;
        if !(1..=MAX_WINDOW_MINUTES).contains(&r.duration_minutes) {
            return Err(WindowError::Duration(r.duration_minutes));
        }
        Ok(MaintenanceWindow {
            days,
            start,
            duration: r.duration_minutes,
        })
    }
}

impl From<MaintenanceWindow> for RawWindow {
    fn from(w: MaintenanceWindow) -> RawWindow {
        RawWindow {
            days: w.days.iter().copied().collect(),
            start: format!("{:02}:{:02}", w.start / 60, w.start % 60),
            duration_minutes: w.duration,
        }
    }
}

/// A whole number from JSON, written as an integer or with a zero fraction (`240.0`): JSON
/// Schema's `integer` is both, and a client that sends either means the same number.
pub fn whole_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let n = serde_json::Number::deserialize(d)?;
    n.as_u64()
        .or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= f64::from(u32::MAX))
                .map(|f| f as u64)
        })
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| {
            serde::de::Error::custom(format!(
                "expected a whole number from 0 to {}, not {n}",
                u32::MAX
            ))
        })
}

fn parse_clock(s: &str) -> Option<u32> {
    let (h, m) = s.split_once(':')?;
    let digits = |x: &str| x.len() == 2 && x.bytes().all(|b| b.is_ascii_digit());
    if !digits(h) || !digits(m) {
        return None;
    }
    let (h, m): (u32, u32) = (h.parse().ok()?, m.parse().ok()?);
    (h < 24 && m < 60).then_some(h * 60 + m)
}

impl MaintenanceWindow {
    /// A window from its parts.
    pub fn new(
        days: impl IntoIterator<Item = Day>,
        start: &str,
        minutes: u32,
    ) -> Result<MaintenanceWindow, WindowError> {
        RawWindow {
            days: days.into_iter().collect(),
            start: start.to_owned(),
            duration_minutes: minutes,
        }
        .try_into()
    }

    /// The openings that could cover `now`: today's and yesterday's (a window lasts at most
    /// a day), each as (open, close).
    fn openings_near(
        &self,
        now: OffsetDateTime,
    ) -> impl Iterator<Item = (OffsetDateTime, OffsetDateTime)> + '_ {
        let now = now.to_offset(time::UtcOffset::UTC);
        (-1i64..=7).filter_map(move |d| {
            let date = now.date().checked_add(time::Duration::days(d))?;
            self.days
                .iter()
                .any(|day| day.weekday() == date.weekday())
                .then(|| {
                    let open = date.midnight().assume_utc()
                        + time::Duration::minutes(i64::from(self.start));
                    (
                        open,
                        open + time::Duration::minutes(i64::from(self.duration)),
                    )
                })
        })
    }

    /// Whether the window is open at `now`.
    pub fn contains(&self, now: OffsetDateTime) -> bool {
        self.openings_near(now)
            .any(|(open, close)| open <= now && now < close)
    }

    /// When the window next opens, at or after `now` (`now` itself when open).
    pub fn next_open(&self, now: OffsetDateTime) -> OffsetDateTime {
        if self.contains(now) {
            return now;
        }
        self.openings_near(now)
            .map(|(open, _)| open)
            .filter(|open| *open >= now)
            .min()
            // Some listed day comes within the next 7 days.
            .unwrap_or(now)
    }
}

impl fmt::Display for MaintenanceWindow {
    /// `sat,sun 02:00 240m`: what [`FromStr`] reads.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let days: Vec<&str> = self.days.iter().map(|d| d.as_str()).collect();
        write!(
            f,
            "{} {:02}:{:02} {}m",
            days.join(","),
            self.start / 60,
            self.start % 60,
            self.duration
        )
    }
}

impl FromStr for MaintenanceWindow {
    type Err = WindowError;

    /// `DAYS HH:MM DURATION`: days comma-separated (`mon` .. `sun`, or `daily`, `weekdays`,
    /// `weekends`), the start in UTC, and a duration in minutes or hours (`90m`, `4h`).
    fn from_str(s: &str) -> Result<MaintenanceWindow, WindowError> {
        let parts: Vec<&str> = s.split_whitespace().collect();
        let [days, start, dur] = parts[..] else {
            return Err(WindowError::Text(s.to_owned()));
        };
        let mut set = Vec::new();
        for d in days.split(',') {
            match d {
                "daily" => set.extend(Day::ALL),
                "weekdays" => set.extend(&Day::ALL[..5]),
                "weekends" => set.extend(&Day::ALL[5..]),
                other => set.push(
                    Day::ALL
                        .into_iter()
                        .find(|x| x.as_str() == other)
                        .ok_or_else(|| WindowError::Day(other.to_owned()))?,
                ),
            }
        }
        let minutes = match (dur.strip_suffix('h'), dur.strip_suffix('m')) {
            (Some(h), _) => h.parse::<u32>().ok().and_then(|h| h.checked_mul(60)),
            (_, Some(m)) => m.parse::<u32>().ok(),
            _ => None,
        }
        .ok_or_else(|| WindowError::Text(s.to_owned()))?;
        MaintenanceWindow::new(set, start, minutes)
    }
}

#[cfg(test)]
mod tests;
