use super::*;

const MIN: i64 = 60_000;

#[test]
fn dropping_nodes_table() {
    let h = |events_lost, batches_dropped| AgentHealth {
        events_lost,
        batches_dropped,
        ..AgentHealth::default()
    };
    let map = |entries: &[(&str, u64, AgentHealth)]| -> Reports {
        entries
            .iter()
            .map(|(node, instance, health)| ((node.to_string(), *instance), *health))
            .collect()
    };
    type Case = (
        &'static str,
        Reports,
        Reports,
        Vec<(&'static str, AgentHealth)>,
    );
    // (case, before, now, dropping: (node, what it lost since))
    let cases: Vec<Case> = vec![
        (
            "the same counts: nothing lost",
            map(&[("n1", 7, h(5, 0))]),
            map(&[("n1", 7, h(5, 0))]),
            vec![],
        ),
        (
            "grown counts: what was lost since",
            map(&[("n1", 7, h(5, 0)), ("n2", 9, h(0, 0))]),
            map(&[("n1", 7, h(8, 1)), ("n2", 9, h(0, 0))]),
            vec![("n1", h(3, 1))],
        ),
        (
            "first seen by this replica: a baseline, whatever it says",
            map(&[]),
            map(&[("n1", 7, h(50, 2))]),
            vec![],
        ),
        (
            "a new agent process counts from 0: all it says is new",
            map(&[("n1", 7, h(50, 2))]),
            map(&[("n1", 8, h(1, 0))]),
            vec![("n1", h(1, 0))],
        ),
        (
            "a new agent process that lost nothing",
            map(&[("n1", 7, h(50, 2))]),
            map(&[("n1", 8, h(0, 0))]),
            vec![],
        ),
        (
            "two processes of one node (a rolling update): each against its own counts",
            map(&[("n1", 7, h(50, 2)), ("n1", 8, h(1, 0))]),
            map(&[("n1", 7, h(50, 2)), ("n1", 8, h(1, 0))]),
            vec![],
        ),
        (
            "two processes, one losing: only its growth",
            map(&[("n1", 7, h(50, 2)), ("n1", 8, h(1, 0))]),
            map(&[("n1", 7, h(50, 2)), ("n1", 8, h(4, 0))]),
            vec![("n1", h(3, 0))],
        ),
    ];
    for (case, before, now, expected) in cases {
        let got: Vec<(String, AgentHealth)> = dropping_nodes(&before, &now)
            .into_iter()
            .map(|d| (d.node, d.lost))
            .collect();
        let expected: Vec<(String, AgentHealth)> = expected
            .into_iter()
            .map(|(n, l)| (n.to_string(), l))
            .collect();
        assert_eq!(got, expected, "{case}");
    }
}

#[test]
fn an_episode_ends_once_quiet_while_the_agent_streams() {
    let streaming = |open| NodeSeen {
        open,
        since_ms: 0,
        health: Default::default(),
    };
    let quiet_ms = QUIET.as_millis() as i64;
    let mut episodes: BTreeMap<String, i64> =
        [("a".into(), 0), ("b".into(), 0), ("c".into(), quiet_ms)].into();
    let seen: HashMap<String, NodeSeen> = [
        ("a".into(), streaming(1)),
        ("b".into(), streaming(0)),
        ("c".into(), streaming(1)),
    ]
    .into();
    assert_eq!(quiet_episodes(&mut episodes, &seen, quiet_ms), ["a"]);
    assert_eq!(
        episodes.keys().collect::<Vec<_>>(),
        ["b", "c"],
        "b's agent stopped (left open), c is not quiet yet"
    );
}

#[test]
fn cost_samples_span_ten_seconds_and_go_stale() {
    let c = |at| AgentHealth {
        cost_sampled_ms: at,
        ..AgentHealth::default()
    };
    let look = |entries: &[(u64, i64)]| -> Reports {
        entries
            .iter()
            .map(|(instance, at)| (("n1".to_string(), *instance), c(*at)))
            .collect()
    };
    let key = ("n1".to_string(), 7);
    let span = |samples: &CostSamples, now_ms| {
        let (bases, latest) = samples.fresh(now_ms);
        (
            bases.get(&key).map(|b| b.cost_sampled_ms),
            latest.get(&key).map(|l| l.cost_sampled_ms),
        )
    };
    let mut samples = CostSamples::default();
    // A batch every 2 s (early flushes): no rate before 10 s of samples, then over 10 to 20 s. (A
    // sample at 0 would be "not read": the times start at 1 s.)
    for (i, at) in (0..=12).map(|i| (i, 1_000 + i * 2_000)) {
        samples.advance(&look(&[(7, at)]), at);
        let want_base = match at {
            ..11_000 => None,
            11_000..19_000 => Some(1_000),
            _ => Some(9_000),
        };
        assert_eq!(
            span(&samples, at),
            (want_base, Some(at)),
            "sample {i} at {at} ms"
        );
    }
    // A look without a new batch keeps the pair.
    samples.advance(&look(&[(7, 25_000)]), 26_000);
    assert_eq!(span(&samples, 26_000), (Some(9_000), Some(25_000)));
    // After a gap, the sample before it is the base.
    samples.advance(&look(&[(7, 60_000)]), 60_000);
    assert_eq!(span(&samples, 60_000), (Some(25_000), Some(60_000)));
    // No new sample for over a minute (the process stopped, or sends nothing): not judged, although
    // every look hands the same sample in again (the ingest keeps each process's last report).
    // Fresh for a minute, or three of its intervals when longer (35 s here: 105 s).
    samples.advance(&look(&[(7, 60_000)]), 100_000);
    let fresh_for = COST_SAMPLE_FRESH_MS.max(3 * 35_000);
    assert_eq!(
        span(&samples, 60_000 + fresh_for),
        (Some(25_000), Some(60_000))
    );
    assert_eq!(span(&samples, 60_000 + fresh_for + 1), (None, None));
    // A rolling update: the old process's last sample beside the new one's until the new one has
    // a base after it (it ran 10 s past the old one's last report), then only the new process.
    samples.advance(&look(&[(7, 60_000), (9, 61_000)]), 61_000);
    assert_eq!(
        samples.fresh(61_000).1.len(),
        2,
        "both, the new one without a base"
    );
    samples.advance(&look(&[(7, 60_000), (9, 75_000)]), 75_000);
    let (bases, latest) = samples.fresh(75_000);
    assert_eq!(
        (bases.len(), latest.keys().map(|k| k.1).collect::<Vec<_>>()),
        (1, vec![9]),
        "the old process is replaced, the new one has its base"
    );
    // A process gone from the reports is forgotten; a new one starts without a base.
    samples.advance(&look(&[(8, 70_000)]), 70_000);
    assert_eq!(span(&samples, 70_000), (None, None));
    assert_eq!(samples.fresh(70_000).1.len(), 1);
    // A sample older than the newest (a resent batch) changes nothing.
    samples.advance(&look(&[(8, 65_000)]), 71_000);
    assert_eq!(
        samples.fresh(71_000).1[&("n1".to_string(), 8)].cost_sampled_ms,
        70_000
    );
}

#[test]
fn a_node_is_over_budget_once_over_on_two_samples_in_a_row() {
    // Nodes over at this look, each with its newest sample's time.
    let over = |nodes: &[(&str, i64)]| -> Vec<OverBudget> {
        nodes
            .iter()
            .map(|(n, sampled_ms)| OverBudget {
                node: n.to_string(),
                cpu_cores: Some(2.0),
                memory_bytes: 0,
                sampled_ms: *sampled_ms,
            })
            .collect()
    };
    let names = |o: Vec<OverBudget>| o.into_iter().map(|o| o.node).collect::<Vec<_>>();
    let mut last = BTreeMap::new();
    assert!(
        confirmed_over(over(&[("a", 10_000), ("b", 10_000)]), &mut last).is_empty(),
        "once: not yet"
    );
    // An agent flushing every 20 s: the next look (15 s on) has no new sample of a, whose one
    // window over is still one window.
    assert!(
        confirmed_over(over(&[("a", 10_000)]), &mut last).is_empty(),
        "the same sample judged twice is not two windows"
    );
    assert_eq!(
        names(confirmed_over(over(&[("a", 30_000)]), &mut last)),
        ["a"]
    );
    assert_eq!(
        names(confirmed_over(over(&[("a", 30_000)]), &mut last)),
        ["a"],
        "stays over on the same sample"
    );
    assert!(
        confirmed_over(over(&[("b", 20_000)]), &mut last).is_empty(),
        "b's look in between was not over: its run starts again"
    );
    assert_eq!(
        names(confirmed_over(over(&[("b", 30_000)]), &mut last)),
        ["b"]
    );
}

#[test]
fn a_process_that_flushes_rarely_stays_fresh_for_three_of_its_intervals() {
    let c = |at| AgentHealth {
        cost_sampled_ms: at,
        ..AgentHealth::default()
    };
    let look = |at| -> Reports { [(("n1".to_string(), 7), c(at))].into() };
    let mut samples = CostSamples::default();
    // `--flush-seconds 90`: a batch every 90 s.
    samples.advance(&look(1_000), 1_000);
    samples.advance(&look(91_000), 91_000);
    assert_eq!(
        samples.fresh(91_000 + 80_000).1.len(),
        1,
        "80 s after its last: fresh"
    );
    assert_eq!(samples.fresh(91_000 + 270_000).1.len(), 1);
    assert!(
        samples.fresh(91_000 + 270_001).1.is_empty(),
        "three intervals without a batch"
    );
    // Idle for an hour, then one batch: fresh for ten minutes, not three hours.
    samples.advance(&look(3_691_000), 3_691_000);
    assert_eq!(samples.fresh(3_691_000 + 600_000).1.len(), 1);
    assert!(samples.fresh(3_691_000 + 600_001).1.is_empty());
}

#[test]
fn after_a_node_reboot_its_new_agent_is_judged_though_its_clock_started_over() {
    let c = |at| AgentHealth {
        cost_sampled_ms: at,
        ..AgentHealth::default()
    };
    let look = |entries: &[(u64, i64)]| -> Reports {
        entries
            .iter()
            .map(|(instance, at)| (("n1".to_string(), *instance), c(*at)))
            .collect()
    };
    let mut samples = CostSamples::default();
    // The agent before the reboot: up for a week (its monotonic clock), its last batch at 100 s
    // on the controller's clock; its report stays in the node's presence.
    let week = 7 * 86_400_000;
    samples.advance(&look(&[(7, week)]), 80_000);
    samples.advance(&look(&[(7, week + 20_000)]), 100_000);
    // The node reboots; the new agent's clock starts near 0.
    samples.advance(&look(&[(7, week + 20_000), (9, 30_000)]), 130_000);
    samples.advance(&look(&[(7, week + 20_000), (9, 45_000)]), 145_000);
    let (bases, latest) = samples.fresh(145_000);
    assert_eq!(
        (
            bases.keys().map(|k| k.1).collect::<Vec<_>>(),
            latest.keys().map(|k| k.1).collect::<Vec<_>>()
        ),
        (vec![9], vec![9]),
        "the new agent is judged, the old one replaced"
    );
    // Confirmation takes any other sample time as new, smaller ones too.
    let over = |sampled_ms| OverBudget {
        node: "n1".into(),
        cpu_cores: Some(2.0),
        memory_bytes: 0,
        sampled_ms,
    };
    let mut last = BTreeMap::new();
    assert!(confirmed_over(vec![over(week + 20_000)], &mut last).is_empty());
    assert_eq!(confirmed_over(vec![over(45_000)], &mut last).len(), 1);
}

#[test]
fn over_budget_table() {
    const MIB: u64 = 1 << 20;
    // A cost sample at `at` ms: CPU ms, eBPF ns, RSS MiB.
    let c = |at, cpu_ms, kernel_ns, rss_mib| AgentHealth {
        cost_sampled_ms: at,
        cpu_ms,
        kernel_ns,
        rss_bytes: rss_mib * MIB,
        ..AgentHealth::default()
    };
    let map = |entries: &[(&str, u64, AgentHealth)]| -> Reports {
        entries
            .iter()
            .map(|(node, instance, health)| ((node.to_string(), *instance), *health))
            .collect()
    };
    let budget = Budget {
        cpu_cores: 0.5,
        memory_bytes: 200 * MIB,
    };
    // (case, before, now, budget, over: (node, cores, MiB))
    type Case = (
        &'static str,
        Reports,
        Reports,
        Budget,
        Vec<(&'static str, Option<f64>, u64)>,
    );
    let cases: Vec<Case> = vec![
        (
            "within: 0.1 cores, 50 MiB",
            map(&[("n1", 7, c(10_000, 1_000, 0, 40))]),
            map(&[("n1", 7, c(20_000, 2_000, 0, 50))]),
            budget,
            vec![],
        ),
        (
            "over on CPU: 0.8 cores in the process",
            map(&[("n1", 7, c(10_000, 1_000, 0, 40))]),
            map(&[("n1", 7, c(20_000, 9_000, 0, 50))]),
            budget,
            vec![("n1", Some(0.8), 50)],
        ),
        (
            "over on CPU with the eBPF programs' time: 0.3 + 0.3 cores",
            map(&[("n1", 7, c(10_000, 1_000, 1_000_000_000, 40))]),
            map(&[("n1", 7, c(20_000, 4_000, 4_000_000_000, 50))]),
            budget,
            vec![("n1", Some(0.6), 50)],
        ),
        (
            "over on memory, with one sample only (CPU not measured yet)",
            map(&[]),
            map(&[("n1", 7, c(20_000, 9_000, 0, 250))]),
            budget,
            vec![("n1", None, 250)],
        ),
        (
            "one sample only and little memory: nothing to say",
            map(&[]),
            map(&[("n1", 7, c(20_000, 9_000, 0, 50))]),
            budget,
            vec![],
        ),
        (
            "the same sample again (no new batch): no rate, not over",
            map(&[("n1", 7, c(20_000, 9_000, 0, 50))]),
            map(&[("n1", 7, c(20_000, 9_000, 0, 50))]),
            budget,
            vec![],
        ),
        (
            "an agent older than the cost fields is never over",
            map(&[("n1", 7, AgentHealth::default())]),
            map(&[("n1", 7, AgentHealth::default())]),
            budget,
            vec![],
        ),
        (
            "two processes of a node (a rolling update): their CPU sums, the larger memory",
            map(&[
                ("n1", 7, c(10_000, 0, 0, 90)),
                ("n1", 8, c(10_000, 0, 0, 10)),
            ]),
            map(&[
                ("n1", 7, c(20_000, 3_000, 0, 90)),
                ("n1", 8, c(20_000, 3_000, 0, 20)),
            ]),
            budget,
            vec![("n1", Some(0.6), 90)],
        ),
        (
            "budgets of 0 are not checked",
            map(&[("n1", 7, c(10_000, 0, 0, 900))]),
            map(&[("n1", 7, c(20_000, 10_000, 0, 900))]),
            Budget::default(),
            vec![],
        ),
    ];
    for (case, before, now, budget, expected) in cases {
        let got: Vec<(String, Option<f64>, u64)> = over_budget(&before, &now, budget)
            .into_iter()
            .map(|o| {
                (
                    o.node,
                    o.cpu_cores.map(|c| (c * 1000.0).round() / 1000.0),
                    o.memory_bytes / MIB,
                )
            })
            .collect();
        let expected: Vec<(String, Option<f64>, u64)> = expected
            .into_iter()
            .map(|(n, c, m)| (n.to_string(), c, m))
            .collect();
        assert_eq!(got, expected, "{case}");
    }
}

#[test]
fn silent_nodes_table() {
    let open = |since_ms| NodeSeen {
        open: 1,
        since_ms,
        health: Default::default(),
    };
    let closed = |since_ms| NodeSeen {
        open: 0,
        since_ms,
        health: Default::default(),
    };
    struct Case {
        name: &'static str,
        pods: &'static [(&'static str, usize)],
        seen: Vec<(&'static str, NodeSeen)>,
        watching_since: i64,
        now: i64,
        want: Vec<(&'static str, usize, i64)>,
    }
    let cases = [
        Case {
            name: "a node whose agent streams is covered",
            pods: &[("a", 3)],
            seen: vec![("a", open(0))],
            watching_since: 0,
            now: 10 * MIN,
            want: vec![],
        },
        Case {
            name: "never seen: silent once the leader has watched for the threshold",
            pods: &[("a", 3)],
            seen: vec![],
            watching_since: 0,
            now: 2 * MIN,
            want: vec![("a", 3, 0)],
        },
        Case {
            name: "never seen, but the leader started watching only just now",
            pods: &[("a", 3)],
            seen: vec![],
            watching_since: 9 * MIN,
            now: 10 * MIN,
            want: vec![],
        },
        Case {
            name: "closed a minute ago: not yet; closed 3 minutes ago: silent",
            pods: &[("a", 1), ("b", 2)],
            seen: vec![("a", closed(9 * MIN)), ("b", closed(7 * MIN))],
            watching_since: 0,
            now: 10 * MIN,
            want: vec![("b", 2, 7 * MIN)],
        },
        Case {
            name: "closed before this replica led: counted from when it leads",
            pods: &[("a", 1)],
            seen: vec![("a", closed(MIN))],
            watching_since: 9 * MIN,
            now: 10 * MIN,
            want: vec![],
        },
        Case {
            name: "a node without running pods is never silent",
            pods: &[("a", 0)],
            seen: vec![],
            watching_since: 0,
            now: 10 * MIN,
            want: vec![],
        },
    ];
    for case in cases {
        let pods: BTreeMap<String, usize> =
            case.pods.iter().map(|(n, p)| (n.to_string(), *p)).collect();
        let seen: HashMap<String, NodeSeen> = case
            .seen
            .into_iter()
            .map(|(n, s)| (n.to_string(), s))
            .collect();
        let got: Vec<(String, usize, i64)> =
            silent_nodes(&pods, &seen, case.watching_since, case.now, 2 * MIN)
                .into_iter()
                .map(|s| (s.node, s.pods, s.since_ms))
                .collect();
        let want: Vec<(String, usize, i64)> = case
            .want
            .into_iter()
            .map(|(n, p, s)| (n.to_string(), p, s))
            .collect();
        assert_eq!(got, want, "{}", case.name);
    }
}
