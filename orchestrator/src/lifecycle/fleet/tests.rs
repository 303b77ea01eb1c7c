use crate::lifecycle::fleet::*;
use proptest::prelude::*;

fn at(s: &str) -> OffsetDateTime {
    OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).unwrap()
}

fn tenant(id: i64, name: &str, version: &str, labels: &[(&str, &str)]) -> Candidate {
    Candidate {
        id,
        name: name.into(),
        version: version.into(),
        labels: labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        fleet_upgrades: FleetUpgrades::Include,
    }
}

fn request(target: &str) -> Request {
    Request {
        target: target.into(),
        selector: Selector::default(),
        chain: false,
        allow_preview: false,
        canary: 1,
    }
}

/// The built-in catalog with 1.35 expired.
fn with_expired() -> Catalog {
    let yaml = include_str!("../../../../templates/versions.yaml");
    Catalog::parse(&yaml.replace("class: deprecated", "class: expired")).unwrap()
}

#[test]
fn label_selectors_are_equality_pairs() {
    let s = parse_label_selector("env=dev,tier=web").unwrap();
    assert_eq!(
        s,
        [("env".into(), "dev".into()), ("tier".into(), "web".into())]
    );
    for bad in [
        "",
        "env",
        "e nv=x",
        "env!=dev",
        "env=dev,",
        "env=dev, tier=web",
        "a=b=c",
    ] {
        assert!(parse_label_selector(bad).is_err(), "{bad}");
    }
    // A key asked twice with two values matches nothing.
    let sel = Selector {
        labels: parse_label_selector("env=dev,env=prod").unwrap(),
        ..Default::default()
    };
    assert!(!sel.matches(&tenant(1, "a", "1.36", &[("env", "dev")])));
}

proptest! {
    /// The OpenAPI document's pattern for `selector.labels` and the parser agree.
    #[test]
    fn the_label_selector_pattern_is_what_the_parser_takes(
        s in proptest::string::string_regex("[a-z=,. !A-Z0-9_/-]{0,12}").unwrap(),
    ) {
        let re = fancy_regex::Regex::new(LABEL_SELECTOR_PATTERN).unwrap();
        prop_assert_eq!(parse_label_selector(&s).is_ok(), re.is_match(&s).unwrap(), "{:?}", s);
    }
}

#[test]
fn waves_start_with_the_canary_and_double() {
    let waves: Vec<u32> = (0..15).map(|i| wave_of(i, 1)).collect();
    assert_eq!(waves, [0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3]);
    let waves: Vec<u32> = (0..9).map(|i| wave_of(i, 3)).collect();
    assert_eq!(waves, [0, 0, 0, 1, 1, 1, 1, 1, 1]);
}

#[test]
fn the_request_is_refused_for_the_target_or_a_named_tenant_naming_the_field() {
    let c = Catalog::builtin();
    let tenants = [
        tenant(1, "a", "1.36", &[]),
        tenant(2, "b", "1.35", &[]),
        tenant(3, "c", "1.37", &[]),
    ];
    let refused = |r: Request| plan(&c, &r, &tenants).unwrap_err();
    let e = refused(Request {
        selector: Selector {
            version: Some("1.37".into()),
            ..Default::default()
        },
        ..request("1.36")
    });
    assert_eq!(e.field(), "selector.version");
    assert!(e.to_string().contains("no-downgrade"), "{e}");
    let e = refused(Request {
        selector: Selector {
            version: Some("1.35".into()),
            ..Default::default()
        },
        ..request("1.37")
    });
    assert!(e.to_string().contains("one-minor-per-hop"), "{e}");
    let names = |n: &[&str]| Selector {
        names: Some(n.iter().map(|s| (*s).to_owned()).collect()),
        ..Default::default()
    };
    let e = refused(Request {
        selector: names(&["c"]),
        ..request("1.36")
    });
    assert_eq!(
        (e.field(), e.to_string().contains("no-downgrade")),
        ("selector.names", true),
        "{e}"
    );
    let e = refused(Request {
        selector: names(&["b"]),
        ..request("1.37")
    });
    assert_eq!(e.field(), "chain", "{e}");
    let e = refused(Request {
        selector: names(&["zz"]),
        ..request("1.37")
    });
    assert_eq!(e, PlanError::UnknownName("zz".into()));
    let e = refused(request("1.38"));
    assert_eq!(e.field(), "target");
    let e = plan(&with_expired(), &request("1.35"), &tenants).unwrap_err();
    assert!(e.to_string().contains("no-expired-target"), "{e}");
    let e = refused(Request {
        selector: Selector {
            labels: [("env".to_owned(), "none".to_owned())].into(),
            ..Default::default()
        },
        ..request("1.37")
    });
    assert_eq!(e.field(), "selector");
}

#[test]
fn selection_skips_opted_out_tenants_but_never_expired_ones() {
    let c = with_expired();
    let mut out_of_fleet = tenant(4, "d-opted-out", "1.36", &[("env", "dev")]);
    out_of_fleet.fleet_upgrades = FleetUpgrades::Exclude;
    let mut expired_out = tenant(5, "e-expired", "1.35", &[("env", "prod")]);
    expired_out.fleet_upgrades = FleetUpgrades::Exclude;
    let tenants = [
        tenant(3, "c", "1.36", &[("env", "dev")]),
        tenant(1, "a", "1.36", &[("env", "dev")]),
        tenant(2, "b", "1.36", &[("env", "prod")]),
        tenant(6, "f-new", "1.37", &[("env", "dev")]),
        out_of_fleet,
        expired_out,
    ];
    let r = Request {
        selector: Selector {
            labels: [("env".to_owned(), "dev".to_owned())].into(),
            ..Default::default()
        },
        ..request("1.37")
    };
    let p = plan(&c, &r, &tenants).unwrap();
    let got: Vec<(&str, &str, u32)> = p
        .iter()
        .map(|p| (p.name.as_str(), p.target.as_str(), p.wave))
        .collect();
    // By name; the expired tenant goes one minor only, opted out or not.
    assert_eq!(
        got,
        [("a", "1.37", 0), ("c", "1.37", 1), ("e-expired", "1.36", 1)]
    );
    let forced = p[2].forced.as_deref().unwrap();
    assert!(
        forced.contains("1.35 is expired") && forced.contains("opted out"),
        "{forced}"
    );
    assert!(p.iter().all(|p| p.skip.is_none()));
    // The plan is a function of its input, not of the order tenants come in.
    let mut reversed = tenants.to_vec();
    reversed.reverse();
    assert_eq!(plan(&c, &r, &reversed).unwrap(), p);
}

#[test]
fn a_selected_tenant_two_minors_behind_is_skipped_without_chain_and_moved_with_it() {
    let c = Catalog::builtin();
    let tenants = [tenant(1, "a", "1.35", &[]), tenant(2, "b", "1.36", &[])];
    let p = plan(&c, &request("1.37"), &tenants).unwrap();
    assert!(
        p[0].skip.as_deref().unwrap().contains("one-minor-per-hop"),
        "{p:?}"
    );
    assert_eq!((p[1].skip.as_deref(), p[1].wave), (None, 0));
    let p = plan(
        &c,
        &Request {
            chain: true,
            ..request("1.37")
        },
        &tenants,
    )
    .unwrap();
    assert!(
        p.iter()
            .all(|p| p.skip.is_none() && p.target == "1.37" && p.chain)
    );
}

/// Names are unique per owner only: a name in `selector.names` means every live tenant of
/// that name, whoever owns it, each its own entry.
#[test]
fn a_selected_name_takes_every_owners_tenant_of_that_name() {
    let c = Catalog::builtin();
    let tenants = [
        tenant(7, "twin", "1.36", &[]),
        tenant(3, "twin", "1.36", &[]),
        tenant(5, "other", "1.36", &[]),
    ];
    let p = plan(
        &c,
        &Request {
            selector: Selector {
                names: Some(["twin".to_owned()].into()),
                ..Default::default()
            },
            ..request("1.37")
        },
        &tenants,
    )
    .unwrap();
    let ids: Vec<(i64, &str)> = p.iter().map(|e| (e.tenant_id, e.name.as_str())).collect();
    assert_eq!(ids, [(3, "twin"), (7, "twin")], "both, by name then id");
}

fn pace(max_parallel: u32, failure_budget: u32, soak: u64) -> Pace {
    Pace {
        max_parallel,
        failure_budget,
        soak: Duration::from_secs(soak),
        respect_windows: true,
    }
}

fn running() -> Progress {
    Progress {
        state: FleetState::Running,
        current_wave: 0,
        soak_until: None,
        reason: None,
    }
}

fn entry(id: i64, wave: u32, state: FleetEntryState) -> Entry {
    Entry {
        tenant_id: id,
        wave,
        state,
        window: None,
        upgrade: None,
    }
}

#[test]
fn the_canary_goes_alone_then_the_next_wave_after_the_soak() {
    use FleetEntryState as E;
    let now = at("2026-01-01T00:00:00Z");
    let mut es = vec![
        entry(1, 0, E::Pending),
        entry(2, 1, E::Pending),
        entry(3, 1, E::Pending),
    ];
    let s = step(&running(), &pace(50, 0, 60), &es, now);
    assert_eq!(s.start, [1]);
    es[0].state = E::Running;
    es[0].upgrade = Some((UpgradeState::Running, None));
    let s = step(&running(), &pace(50, 0, 60), &es, now);
    assert!(s.start.is_empty() && s.finished.is_empty());
    es[0].upgrade = Some((UpgradeState::Succeeded, None));
    let s = step(&running(), &pace(50, 0, 60), &es, now);
    assert_eq!(s.finished, [(1, E::Succeeded, None)]);
    assert!(s.start.is_empty(), "soaking first");
    let until = at("2026-01-01T00:01:00Z");
    assert_eq!(
        (s.progress.soak_until, s.wake_at),
        (Some(until), Some(until))
    );
    es[0].state = E::Succeeded;
    let s2 = step(
        &s.progress,
        &pace(50, 0, 60),
        &es,
        at("2026-01-01T00:00:30Z"),
    );
    assert!(s2.start.is_empty());
    let s3 = step(&s.progress, &pace(50, 0, 60), &es, until);
    assert_eq!(
        (
            s3.start.as_slice(),
            s3.progress.current_wave,
            s3.progress.soak_until
        ),
        (&[2, 3][..], 1, None)
    );
    es[1].state = E::Succeeded;
    es[2].state = E::Succeeded;
    let s4 = step(&s3.progress, &pace(50, 0, 60), &es, until);
    assert_eq!(s4.progress.state, FleetState::Succeeded);
}

#[test]
fn more_failures_in_a_wave_than_the_budget_stop_the_fleet_and_skip_the_rest() {
    use FleetEntryState as E;
    let now = at("2026-01-01T00:00:00Z");
    let mut es = vec![
        entry(1, 0, E::Running),
        entry(2, 0, E::Running),
        entry(3, 1, E::Pending),
    ];
    es[0].upgrade = Some((
        UpgradeState::RolledBack,
        Some("apiserver never ready".into()),
    ));
    es[1].upgrade = Some((UpgradeState::Running, None));
    // One failure is within a budget of one: the other tenant of the wave goes on.
    let s = step(&running(), &pace(50, 1, 0), &es, now);
    assert_eq!(
        s.finished,
        [(1, E::Failed, Some("apiserver never ready".into()))]
    );
    assert_eq!(s.progress.state, FleetState::Running);
    // Over a budget of zero: stopped, and the next wave never starts.
    let s = step(&running(), &pace(50, 0, 0), &es, now);
    assert_eq!(s.progress.state, FleetState::Failed);
    assert!(
        s.progress
            .reason
            .as_deref()
            .unwrap()
            .contains("failure budget of 0")
    );
    assert!(s.start.is_empty());
    assert!(
        matches!(&s.finished[..], [(1, E::Failed, _), (3, E::Skipped, Some(why))] if why.contains("stopped")),
        "{s:?}"
    );
}

#[test]
fn a_tenant_outside_its_window_waits_for_it_and_paused_fleets_start_nobody() {
    use FleetEntryState as E;
    let now = at("2026-01-03T12:00:00Z"); // Saturday noon
    let mut es = vec![entry(1, 0, E::Pending), entry(2, 0, E::Pending)];
    es[0].window = Some("sun 02:00 1h".parse().unwrap());
    es[1].window = Some("sat 11:00 2h".parse().unwrap());
    let s = step(&running(), &pace(50, 0, 0), &es, now);
    assert_eq!(s.start, [2]);
    assert_eq!(s.wake_at, Some(at("2026-01-04T02:00:00Z")));
    // The held entry says why, and when it moves.
    assert_eq!(s.waiting.len(), 1);
    assert_eq!(s.waiting[0].0, 1);
    assert!(
        s.waiting[0]
            .1
            .ends_with("which opens at 2026-01-04T02:00:00Z"),
        "{:?}",
        s.waiting
    );
    let s = step(
        &running(),
        &Pace {
            respect_windows: false,
            ..pace(50, 0, 0)
        },
        &es,
        now,
    );
    assert_eq!(s.start, [1, 2]);
    assert!(s.waiting.is_empty());
    let paused = Progress {
        state: FleetState::Paused,
        ..running()
    };
    assert!(step(&paused, &pace(50, 0, 0), &es, now).start.is_empty());
}

proptest! {
    #[test]
    fn waves_are_contiguous_and_grow(n in 1usize..500, canary in 1u32..20) {
        let waves: Vec<u32> = (0..n).map(|i| wave_of(i, canary)).collect();
        prop_assert_eq!(waves[0], 0);
        for pair in waves.windows(2) {
            prop_assert!(pair[1] == pair[0] || pair[1] == pair[0] + 1);
        }
        let size = |w: u32| waves.iter().filter(|x| **x == w).count() as u64;
        prop_assert_eq!(size(0), u64::from(canary).min(n as u64));
        let last = *waves.last().unwrap();
        for w in 1..last {
            prop_assert_eq!(size(w), size(w - 1) * WAVE_GROWTH);
        }
    }

    /// A fleet upgrade driven step by step, each started tenant succeeding or failing as
    /// `fails` says: it ends; no tenant starts twice or outside its wave; never more than
    /// `max_parallel` move at once; it fails exactly when some wave's failures exceed the
    /// budget, and then nothing after that wave started.
    #[test]
    fn a_simulated_fleet_ends_within_its_limits(
        n in 1usize..40, canary in 1u32..4, max_parallel in 1u32..6, budget in 0u32..3,
        fails in proptest::collection::vec(any::<bool>(), 40), finish_per_step in 1usize..4,
    ) {
        use FleetEntryState as E;
        let mut es: Vec<Entry> = (0..n).map(|i| entry(i as i64, wave_of(i, canary), E::Pending)).collect();
        let mut p = running();
        let pace = pace(max_parallel, budget, 0);
        let now = at("2026-01-01T00:00:00Z");
        let mut started = BTreeSet::new();
        for _ in 0..10_000 {
            let s = step(&p, &pace, &es, now);
            for (id, to, _) in &s.finished {
                es[*id as usize].state = *to;
            }
            for id in &s.start {
                prop_assert!(started.insert(*id), "tenant {} started twice", id);
                prop_assert_eq!(es[*id as usize].wave, s.progress.current_wave);
                let e = &mut es[*id as usize];
                prop_assert_eq!(e.state, E::Pending);
                e.state = E::Running;
                e.upgrade = Some((UpgradeState::Running, None));
            }
            let moving = es.iter().filter(|e| e.state == E::Running).count();
            prop_assert!(moving <= max_parallel as usize);
            p = s.progress;
            if p.state.finished() && moving == 0 {
                break;
            }
            // Some running tenants finish before the next step.
            for e in es.iter_mut().filter(|e| e.state == E::Running).take(finish_per_step) {
                let fail = fails[e.tenant_id as usize];
                e.upgrade = Some((if fail { UpgradeState::RolledBack } else { UpgradeState::Succeeded }, None));
            }
        }
        prop_assert!(p.state.finished(), "not finished: {:?}", p);
        prop_assert!(es.iter().all(|e| e.state.finished()));
        let failed_in = |w: u32| es.iter().filter(|e| e.wave == w && e.state == E::Failed).count();
        match p.state {
            FleetState::Succeeded => {
                prop_assert!(es.iter().all(|e| e.state != E::Skipped));
                for w in 0..=es.iter().map(|e| e.wave).max().unwrap() {
                    prop_assert!(failed_in(w) <= budget as usize);
                }
            }
            FleetState::Failed => {
                let w = p.current_wave;
                prop_assert!(failed_in(w) > budget as usize);
                prop_assert!(es.iter().filter(|e| e.wave > w).all(|e| e.state == E::Skipped));
            }
            other => prop_assert!(false, "ended {:?}", other),
        }
    }
}
