//! The scrape: a `prometheus_client` [`Collector`] that sums the counters
//! (`Metrics::sums`) and reads the session registry and configuration,
//! then encodes every family. Nothing is kept between scrapes but the
//! retired totals, so a target, LUN or session that is gone has no series.

use std::fmt;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::metrics::LoginResult;
use crate::metrics::counters::{BUCKETS, LunSnapshot, Op, SENSE_KEYS, bucket_bounds};
use crate::metrics::stats::{TMF_FUNCTIONS, TMF_RESPONSES};
use crate::shared::Shared;

/// A label set: owned values, fixed names.
type Labels = Vec<(&'static str, String)>;

/// Reject reasons by code (RFC 7143 11.17.1), for the `reason` label.
const REJECT_REASONS: [&str; 16] = [
    "other",
    "reserved",
    "data_digest_error",
    "snack_reject",
    "protocol_error",
    "command_not_supported",
    "immediate_command_reject",
    "task_in_progress",
    "invalid_data_ack",
    "invalid_pdu_field",
    "long_op_reject",
    "deprecated",
    "waiting_for_logout",
    "other",
    "other",
    "other",
];

/// Task management functions by code (RFC 7143 11.5.1).
const TMF_FUNCTION_NAMES: [&str; TMF_FUNCTIONS] = [
    "other",
    "abort_task",
    "abort_task_set",
    "clear_aca",
    "clear_task_set",
    "logical_unit_reset",
    "target_warm_reset",
    "target_cold_reset",
    "task_reassign",
];

/// Task management responses by code (RFC 7143 11.6.1; 255 last).
const TMF_RESPONSE_NAMES: [&str; TMF_RESPONSES] = [
    "function_complete",
    "task_does_not_exist",
    "lun_does_not_exist",
    "task_still_allegiant",
    "task_reassignment_not_supported",
    "function_not_supported",
    "authorization_failed",
    "function_rejected",
];

/// Encodes one family: its descriptor, then one sample per label set.
fn family<V: Copy>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    series: impl IntoIterator<Item = (Labels, V)>,
    mut sample: impl FnMut(&mut prometheus_client::encoding::MetricEncoder, V) -> fmt::Result,
) -> fmt::Result {
    let mut metric = encoder.encode_descriptor(name, help, None, kind)?;
    for (labels, value) in series {
        sample(&mut metric.encode_family(&labels)?, value)?;
    }
    Ok(())
}

/// A counter family (the text encoding adds `_total`).
fn counters(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (Labels, u64)>,
) -> fmt::Result {
    family(encoder, name, help, MetricType::Counter, series, |m, v| {
        m.encode_counter::<NoLabelSet, _, u64>(&v, None)
    })
}

/// A gauge family.
fn gauges(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (Labels, i64)>,
) -> fmt::Result {
    family(encoder, name, help, MetricType::Gauge, series, |m, v| {
        m.encode_gauge(&v)
    })
}

fn labels<const N: usize>(pairs: [(&'static str, &str); N]) -> Labels {
    pairs.iter().map(|&(k, v)| (k, v.to_owned())).collect()
}

/// Encodes the target's metrics at each scrape.
pub(crate) struct TargetCollector {
    pub shared: Arc<Shared>,
}

impl fmt::Debug for TargetCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TargetCollector")
    }
}

/// A registry holding the target's collector, encoded per scrape.
pub(crate) fn registry(shared: Arc<Shared>) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(TargetCollector { shared }));
    registry
}

impl Collector for TargetCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let shared = &self.shared;
        let config = shared.config();
        let sums = shared.metrics.sums_for(&config);
        let sessions = shared.sessions.all();
        let names: Vec<&str> = config.targets.iter().map(|t| t.name.as_str()).collect();
        let per_target = |f: &dyn Fn(&str) -> i64| -> Vec<(Labels, i64)> {
            names
                .iter()
                .map(|&t| (labels([("target", t)]), f(t)))
                .collect()
        };
        let of = |t: &str| {
            sessions
                .iter()
                .filter(|s| s.target_name.as_deref() == Some(t))
                .collect::<Vec<_>>()
        };
        gauges(
            &mut e,
            "iscsi_target_sessions",
            "Sessions logged in to the target (normal sessions).",
            per_target(&|t| of(t).len() as i64),
        )?;
        gauges(
            &mut e,
            "iscsi_target_connections",
            "Connections in full feature phase, by the target of their session.",
            per_target(&|t| of(t).iter().map(|s| i64::from(s.connection_count())).sum()),
        )?;
        gauges(
            &mut e,
            "iscsi_target_discovery_sessions",
            "Discovery sessions logged in.",
            [(
                Labels::new(),
                sessions.iter().filter(|s| s.target_name.is_none()).count() as i64,
            )],
        )?;
        let logins = shared.metrics.logins();
        counters(
            &mut e,
            "iscsi_target_login_attempts",
            "Logins (one per connection) by result, the iSCSI MIB / LIO taxonomy.",
            LoginResult::ALL
                .iter()
                .map(|&r| (labels([("result", r.label())]), logins[r as usize])),
        )?;
        self.encode_target_errors(&mut e, &names, &sums)?;
        self.encode_luns(&mut e, &config, &sums)?;
        encode_limits(&mut e, &config, &shared.qos.load())?;
        if shared
            .metrics
            .per_session
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            encode_sessions(&mut e, &sums)?;
        }
        let (ok, failed, last_ok, last_succeeded) = shared.metrics.reloads();
        counters(
            &mut e,
            "iscsi_target_config_reloads",
            "Configuration reloads (SIGHUP, `iscsi target reload`) by result.",
            [
                (labels([("result", "success")]), ok),
                (labels([("result", "failure")]), failed),
            ],
        )?;
        gauges(
            &mut e,
            "iscsi_target_config_last_reload_success_timestamp_seconds",
            "When the last successful reload was, in seconds since the epoch (0: none yet).",
            [(Labels::new(), last_ok as i64)],
        )?;
        gauges(
            &mut e,
            "iscsi_target_config_last_reload_successful",
            "Whether the last reload succeeded (1 before any).",
            [(Labels::new(), i64::from(last_succeeded))],
        )?;
        Ok(())
    }
}

impl TargetCollector {
    /// Per-target session-wide counters: errors, task management, ERL 1
    /// and 2 recovery.
    fn encode_target_errors(
        &self,
        e: &mut DescriptorEncoder,
        names: &[&str],
        sums: &crate::metrics::Sums,
    ) -> fmt::Result {
        let zero = crate::metrics::SessionTotals::default();
        let totals: Vec<(&str, &crate::metrics::SessionTotals)> = names
            .iter()
            .map(|&t| (t, sums.targets.get(t).unwrap_or(&zero)))
            .collect();
        let simple = |f: fn(&crate::metrics::SessionTotals) -> u64| -> Vec<(Labels, u64)> {
            totals
                .iter()
                .map(|(t, s)| (labels([("target", t)]), f(s)))
                .collect()
        };
        counters(
            e,
            "iscsi_target_digest_errors",
            "PDUs whose header digest (the connection then ends) or data digest (rejected) failed.",
            totals.iter().flat_map(|(t, s)| {
                [
                    (
                        labels([("target", t), ("kind", "header")]),
                        s.header_digest_errors,
                    ),
                    (
                        labels([("target", t), ("kind", "data")]),
                        s.rejects_by_reason[0x02],
                    ),
                ]
            }),
        )?;
        counters(
            e,
            "iscsi_target_rejects",
            "Reject PDUs sent, by reason (only reasons seen).",
            totals.iter().flat_map(|(t, s)| {
                (0..16)
                    .filter(|&r| s.rejects_by_reason[r] > 0)
                    .map(|r| {
                        let reason = REJECT_REASONS[r];
                        (
                            labels([("target", t), ("reason", reason)]),
                            s.rejects_by_reason[r],
                        )
                    })
                    .collect::<Vec<_>>()
            }),
        )?;
        counters(
            e,
            "iscsi_target_task_management",
            "Task management requests answered, by function and response (only those seen).",
            totals.iter().flat_map(|(t, s)| {
                let mut series = Vec::new();
                for (row, function) in s.task_management.iter().zip(TMF_FUNCTION_NAMES) {
                    for (&n, response) in row.iter().zip(TMF_RESPONSE_NAMES) {
                        if n > 0 {
                            series.push((
                                labels([
                                    ("target", t),
                                    ("function", function),
                                    ("response", response),
                                ]),
                                n,
                            ));
                        }
                    }
                }
                series
            }),
        )?;
        counters(
            e,
            "iscsi_target_aborted_tasks",
            "Tasks aborted by task management or PREEMPT AND ABORT.",
            simple(|s| s.aborts),
        )?;
        counters(e, "iscsi_target_r2ts", "R2Ts sent.", simple(|s| s.r2ts))?;
        counters(
            e,
            "iscsi_target_snacks",
            "SNACKs answered (ErrorRecoveryLevel 1).",
            simple(|s| s.snacks),
        )?;
        counters(
            e,
            "iscsi_target_snack_resent_pdus",
            "PDUs sent again in answer to SNACKs.",
            simple(|s| s.resent),
        )?;
        counters(
            e,
            "iscsi_target_recovery_r2ts",
            "Data-Out asked for again after a data digest error (ErrorRecoveryLevel 1).",
            simple(|s| s.recovery_r2ts),
        )?;
        counters(
            e,
            "iscsi_target_task_reassignments",
            "Tasks moved to a new connection by TASK REASSIGN (ErrorRecoveryLevel 2).",
            simple(|s| s.reassigned),
        )
    }

    /// Per target and LUN: commands, bytes, CHECK CONDITIONs, latency.
    fn encode_luns(
        &self,
        e: &mut DescriptorEncoder,
        config: &crate::config::TargetConfig,
        sums: &crate::metrics::Sums,
    ) -> fmt::Result {
        let zero = LunSnapshot::default();
        let mut luns: Vec<(Labels, &LunSnapshot, u64)> = Vec::new();
        for target in &config.targets {
            for (&n, lun) in &target.luns {
                let key = (target.name.clone(), n);
                let size = lun.store.size_bytes();
                luns.push((
                    labels([("target", &target.name), ("lun", &n.to_string())]),
                    sums.luns.get(&key).unwrap_or(&zero),
                    size,
                ));
            }
        }
        gauges(
            e,
            "iscsi_target_lun_size_bytes",
            "The LUN's capacity.",
            luns.iter().map(|(l, _, size)| (l.clone(), *size as i64)),
        )?;
        let with_op = |l: &Labels, op: Op| {
            let mut l = l.clone();
            l.push(("op", op.label().to_owned()));
            l
        };
        counters(
            e,
            "iscsi_target_lun_commands",
            "SCSI commands answered (status sent, not aborted), by op: READ and WRITE (6/10/12/16, WRITE AND VERIFY), other.",
            luns.iter()
                .flat_map(|(l, s, _)| Op::ALL.map(|op| (with_op(l, op), s.commands[op as usize]))),
        )?;
        counters(
            e,
            "iscsi_target_lun_read_bytes",
            "Data-In bytes sent (first sending; SNACK resends are not counted).",
            luns.iter().map(|(l, s, _)| (l.clone(), s.read_bytes)),
        )?;
        counters(
            e,
            "iscsi_target_lun_written_bytes",
            "Data-Out and immediate data bytes received for commands that were executed.",
            luns.iter().map(|(l, s, _)| (l.clone(), s.written_bytes)),
        )?;
        counters(
            e,
            "iscsi_target_lun_check_conditions",
            "Commands answered CHECK CONDITION, by sense key (only keys seen).",
            luns.iter().flat_map(|(l, s, _)| {
                (0..16)
                    .filter(|&k| s.check_conditions[k] > 0)
                    .map(|k| {
                        let mut l = l.clone();
                        l.push(("sense_key", SENSE_KEYS[k].to_owned()));
                        (l, s.check_conditions[k])
                    })
                    .collect::<Vec<_>>()
            }),
        )?;
        let bounds = bucket_bounds();
        let mut metric = e.encode_descriptor(
            "iscsi_target_command_duration_seconds",
            "From a SCSI Command PDU's arrival to its status handed to the connection's writer.",
            None,
            MetricType::Histogram,
        )?;
        for (l, s, _) in &luns {
            for op in Op::ALL {
                let i = op as usize;
                let buckets: Vec<(f64, u64)> = (0..=BUCKETS)
                    .map(|b| {
                        (
                            bounds.get(b).copied().unwrap_or(f64::INFINITY),
                            s.latency[i][b],
                        )
                    })
                    .collect();
                let count = s.latency[i].iter().sum();
                let sum = s.latency_ns[i] as f64 * 1e-9;
                metric
                    .encode_family(&with_op(l, op))?
                    .encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?;
            }
        }
        Ok(())
    }
}

/// Per QoS limit (`crate::qos`): commands waiting, delayed, refused, and
/// the time they were held; `limit` is `lun:N` or `initiator:NAME`.
fn encode_limits(
    e: &mut DescriptorEncoder,
    config: &crate::config::TargetConfig,
    qos: &crate::qos::QosTable,
) -> fmt::Result {
    let mut limits = Vec::new();
    for target in &config.targets {
        let Some(of_target) = qos.target(&target.name) else {
            continue;
        };
        for (key, limit) in of_target.all() {
            let which = match &key {
                crate::qos::LimitKey::Lun(n) => format!("lun:{n}"),
                crate::qos::LimitKey::Initiator(name) => format!("initiator:{name}"),
            };
            limits.push((
                labels([("target", &target.name), ("limit", &which)]),
                limit.figures(),
            ));
        }
    }
    gauges(
        e,
        "iscsi_target_qos_waiting_commands",
        "Commands waiting for their turn under the limit now.",
        limits.iter().map(|(l, f)| (l.clone(), f.waiting as i64)),
    )?;
    counters(
        e,
        "iscsi_target_qos_delayed_commands",
        "Commands the limit made wait.",
        limits.iter().map(|(l, f)| (l.clone(), f.delayed)),
    )?;
    counters(
        e,
        "iscsi_target_qos_task_set_full",
        "Commands answered TASK SET FULL: the limit's queue was full, or the wait too long.",
        limits.iter().map(|(l, f)| (l.clone(), f.refused)),
    )?;
    family(
        e,
        "iscsi_target_qos_held_seconds",
        "Time commands waited under the limit, in all.",
        MetricType::Counter,
        limits.iter().map(|(l, f)| (l.clone(), f.held_seconds)),
        |m, v| m.encode_counter::<NoLabelSet, _, u64>(&v, None),
    )
}

/// Per-session series (`--metrics-sessions`): opt-in, because initiator
/// names and TSIHs are unbounded (every login makes a new series).
fn encode_sessions(e: &mut DescriptorEncoder, sums: &crate::metrics::Sums) -> fmt::Result {
    let of = |f: fn(&LunSnapshot) -> u64| {
        sums.sessions
            .iter()
            .map(move |(stats, own)| {
                let l = &stats.labels;
                (
                    labels([
                        ("target", l.target.as_deref().unwrap_or("")),
                        ("initiator", &l.initiator),
                        ("tsih", &l.tsih.to_string()),
                    ]),
                    f(own),
                )
            })
            .collect::<Vec<_>>()
    };
    counters(
        e,
        "iscsi_target_session_commands",
        "SCSI commands answered in the session (all LUNs).",
        of(LunSnapshot::all_commands),
    )?;
    counters(
        e,
        "iscsi_target_session_read_bytes",
        "Data-In bytes sent in the session.",
        of(|s| s.read_bytes),
    )?;
    counters(
        e,
        "iscsi_target_session_written_bytes",
        "Data-Out and immediate data bytes received in the session.",
        of(|s| s.written_bytes),
    )
}
