use crate::window::*;
use proptest::prelude::*;

fn at(s: &str) -> OffsetDateTime {
    OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).unwrap()
}

#[test]
fn windows_open_on_their_days_and_run_past_midnight() {
    // 2026-01-03 is a Saturday.
    let w: MaintenanceWindow = "sat 23:00 2h".parse().unwrap();
    assert!(!w.contains(at("2026-01-03T22:59:59Z")));
    assert!(w.contains(at("2026-01-03T23:00:00Z")));
    assert!(
        w.contains(at("2026-01-04T00:59:59Z")),
        "Sunday, still Saturday's window"
    );
    assert!(!w.contains(at("2026-01-04T01:00:00Z")));
    assert!(!w.contains(at("2026-01-04T23:30:00Z")), "not on Sundays");
    assert_eq!(
        w.next_open(at("2026-01-04T01:00:00Z")),
        at("2026-01-10T23:00:00Z")
    );
    assert_eq!(
        w.next_open(at("2026-01-03T23:30:00Z")),
        at("2026-01-03T23:30:00Z")
    );
    // Offsets other than UTC are the same instant.
    assert!(w.contains(at("2026-01-04T01:30:00+02:00")));
    let daily: MaintenanceWindow = "daily 00:00 1440m".parse().unwrap();
    assert!(daily.contains(at("2026-05-05T13:14:15Z")));
    assert_eq!(daily.to_string(), "mon,tue,wed,thu,fri,sat,sun 00:00 1440m");
    let weekends: MaintenanceWindow = "weekends 02:00 4h".parse().unwrap();
    assert_eq!(
        weekends,
        MaintenanceWindow::new([Day::Sun, Day::Sat], "02:00", 240).unwrap()
    );
    assert_eq!(
        weekends.to_string().parse::<MaintenanceWindow>().unwrap(),
        weekends
    );
}

#[test]
fn malformed_windows_are_refused_with_their_reason() {
    for (bad, why) in [
        ("sat 24:00 1h", "24:00"),
        ("sat 2:00 1h", "2:00"),
        ("sat 02:00 25h", "1500"),
        ("sat 02:00 0m", "not 0"),
        ("someday 02:00 1h", "someday"),
        ("sat 02:00", "like"),
        ("sat 02:00 1d", "like"),
    ] {
        let e = bad.parse::<MaintenanceWindow>().unwrap_err().to_string();
        assert!(e.contains(why), "{bad}: {e}");
    }
    let json = |v: serde_json::Value| serde_json::from_value::<MaintenanceWindow>(v);
    assert!(
        json(serde_json::json!({"days": [], "start": "02:00", "duration_minutes": 60})).is_err()
    );
    assert!(json(serde_json::json!({"days": ["sat"], "start": "02:00", "duration_minutes": 60, "tz": "x"})).is_err());
    let ok =
        json(serde_json::json!({"days": ["sat", "sat"], "start": "02:00", "duration_minutes": 60}))
            .unwrap();
    assert_eq!(
        serde_json::to_value(&ok).unwrap(),
        serde_json::json!({"days": ["sat"], "start": "02:00", "duration_minutes": 60})
    );
}

proptest! {
    #[test]
    fn window_membership_is_an_opening_within_the_duration(
        day in 0usize..7, h in 0u32..24, m in 0u32..60, minutes in 1u32..=1440, offset in 0i64..(14 * 1440),
    ) {
        let w = MaintenanceWindow::new([Day::ALL[day]], &format!("{h:02}:{m:02}"), minutes).unwrap();
        let now = at("2026-01-05T00:00:00Z") + time::Duration::minutes(offset); // a Monday
        // By brute force: some minute in the last `minutes` is an opening.
        let opened = (0..i64::from(minutes)).any(|back| {
            let t = now - time::Duration::minutes(back);
            t.weekday() == Day::ALL[day].weekday() && t.hour() as u32 == h && t.minute() as u32 == m
        });
        prop_assert_eq!(w.contains(now), opened);
        let next = w.next_open(now);
        prop_assert!(next >= now && w.contains(next));
        prop_assert!(next - now <= time::Duration::days(7));
    }
}

#[test]
fn windows_take_whole_numbers_written_either_way_and_at_most_seven_days() {
    let json = |v: serde_json::Value| serde_json::from_value::<MaintenanceWindow>(v);
    let w = json(serde_json::json!({"days": ["mon"], "start": "01:00", "duration_minutes": 90.0}))
        .unwrap();
    assert_eq!(w.to_string(), "mon 01:00 90m");
    assert!(
        json(serde_json::json!({"days": ["mon"], "start": "01:00", "duration_minutes": 90.5}))
            .is_err()
    );
    assert!(
        json(serde_json::json!({"days": ["mon"], "start": "01:00", "duration_minutes": -1}))
            .is_err()
    );
    assert!(
        json(serde_json::json!({"days": vec!["fri"; 8], "start": "01:00", "duration_minutes": 9}))
            .is_err()
    );
    assert!(
        json(serde_json::json!({"days": vec!["fri"; 7], "start": "01:00", "duration_minutes": 9}))
            .is_ok()
    );
}
