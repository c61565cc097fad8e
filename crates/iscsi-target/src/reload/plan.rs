//! What a reload would change, worked out before anything is touched: the
//! running configuration and the sessions using it on one side, a parsed
//! file on the other (no I/O here). Each change says what it disturbs, so
//! that one that would end sessions or take away a LUN in use can be
//! refused (SCST's `-force` rule) with the objects and sessions named.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::config::TargetConfig;
use crate::config::file::{ParsedConfig, PlannedLun};
use crate::config::lun::LunSpec;
pub use crate::registry::{SessionRef, SessionUse};

/// What a change does to what is running.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// Nothing running notices (an addition, a LUN nobody used).
    Free,
    /// Applies to logins and connections made from now on; the ones
    /// running keep what they negotiated or were allowed.
    NextLogin,
    /// Read only when the target starts (the runtime shards): applies
    /// at the next start; nothing running changes.
    Restart,
    /// Sessions lose a LUN they used: needs force.
    LunInUse,
    /// Sessions are ended: needs force.
    EndsSessions,
    /// A LUN shrinks in place (refused where data lies beyond its new
    /// end): needs force, whoever uses it.
    Shrinks,
}

/// One change of a reload: serialised on the control socket and read back
/// by `iscsi target reload|check`, which print it with the same `Display`
/// as the target's log.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Change {
    /// `+` added, `-` removed, `~` changed.
    pub action: char,
    /// What changes: "target iqn...", "target iqn... LUN 2", "portal
    /// 127.0.0.1:3260", "command_window".
    pub object: String,
    /// The old and new values in words.
    pub detail: String,
    /// What it disturbs.
    pub effect: Effect,
    /// The sessions it disturbs (for [`Effect::LunInUse`] and
    /// [`Effect::EndsSessions`]).
    pub sessions: Vec<SessionRef>,
}

impl Change {
    /// Whether applying it needs force.
    pub fn disruptive(&self) -> bool {
        matches!(
            self.effect,
            Effect::LunInUse | Effect::EndsSessions | Effect::Shrinks
        )
    }
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.action, self.object)?;
        if !self.detail.is_empty() {
            write!(f, ": {}", self.detail)?;
        }
        match self.effect {
            Effect::Free => {}
            Effect::NextLogin => write!(f, " (from the next login on)")?,
            Effect::Restart => write!(f, " (at the next start of the target)")?,
            Effect::LunInUse => write!(f, " [LUN in use by")?,
            Effect::EndsSessions => write!(f, " [ends")?,
            Effect::Shrinks if self.sessions.is_empty() => return write!(f, " [shrinks]"),
            Effect::Shrinks => write!(f, " [shrinks a LUN in use by")?,
        }
        if self.disruptive() {
            let names: Vec<String> = self.sessions.iter().map(ToString::to_string).collect();
            write!(f, " {}]", names.join(", "))?;
        }
        Ok(())
    }
}

/// Every change a file makes to the running state.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Plan {
    /// In the order they are applied: removals, then changes, then
    /// additions.
    pub changes: Vec<Change>,
}

impl Plan {
    /// The changes that need force.
    pub fn disruptive(&self) -> impl Iterator<Item = &Change> {
        self.changes.iter().filter(|c| c.disruptive())
    }

    /// The sessions the plan ends (target removed, initiator no longer
    /// allowed), by TSIH.
    pub fn ended_sessions(&self) -> Vec<u16> {
        let mut tsihs: Vec<u16> = self
            .changes
            .iter()
            .filter(|c| c.effect == Effect::EndsSessions)
            .flat_map(|c| c.sessions.iter().map(|s| s.tsih))
            .collect();
        tsihs.sort_unstable();
        tsihs.dedup();
        tsihs
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.changes.is_empty() {
            return writeln!(f, "no changes");
        }
        for change in &self.changes {
            writeln!(f, "{change}")?;
        }
        Ok(())
    }
}

/// Whether a running LUN is kept by a reload: the same store (the same
/// specification, or one that differs only in its size), the same block
/// size; anything else is a new store.
pub(crate) fn keeps(running: &crate::config::LunEntry, planned: &PlannedLun) -> bool {
    let same = running.spec == planned.spec
        || LunSpec::parse(&running.spec).is_ok_and(|spec| spec.same_store(&planned.parsed));
    same && running.store.block_size() == planned.block_size
}

/// The size in bytes a reload gives a LUN it keeps, where the file names
/// one that is not the store's size now (grown or shrunk in the file, or
/// resized by `iscsi target resize` since the file was written).
pub(crate) fn new_size(running: &crate::config::LunEntry, planned: &PlannedLun) -> Option<u64> {
    let now = running.store.size_bytes();
    planned
        .parsed
        .size()
        .filter(|&size| keeps(running, planned) && size != now)
}

/// The changes `new` makes to `old`, with the sessions in `sessions`.
pub fn plan(old: &TargetConfig, new: &ParsedConfig, sessions: &[SessionUse]) -> Plan {
    let mut removals = Vec::new();
    let mut changes = Vec::new();
    let mut additions = Vec::new();
    let of_target = |name: &str| -> Vec<&SessionUse> {
        sessions
            .iter()
            .filter(|s| s.target.as_deref() == Some(name))
            .collect()
    };
    let refs = |list: &[&SessionUse]| list.iter().map(|s| s.session.clone()).collect::<Vec<_>>();

    portals(
        &mut removals,
        &mut additions,
        "portal",
        &old.listen,
        &new.config.listen,
    );
    portals(
        &mut removals,
        &mut additions,
        "iSER portal",
        &old.iser,
        &new.config.iser,
    );

    for target in &old.targets {
        let Some(i) = new
            .config
            .targets
            .iter()
            .position(|t| t.name == target.name)
        else {
            let users = of_target(&target.name);
            removals.push(Change {
                action: '-',
                object: format!("target {}", target.name),
                detail: format!("{} LUNs", target.luns.len()),
                effect: if users.is_empty() {
                    Effect::Free
                } else {
                    Effect::EndsSessions
                },
                sessions: refs(&users),
            });
            continue;
        };
        let wanted = &new.config.targets[i];
        let planned = &new.luns[i];
        let users = of_target(&target.name);
        for (&n, lun) in &target.luns {
            let object = format!("target {} LUN {n}", target.name);
            let using: Vec<&SessionUse> = users
                .iter()
                .copied()
                .filter(|s| s.luns.contains(&n))
                .collect();
            let effect = if using.is_empty() {
                Effect::Free
            } else {
                Effect::LunInUse
            };
            match planned.get(&n) {
                None => removals.push(Change {
                    action: '-',
                    object,
                    detail: lun.spec.clone(),
                    effect,
                    sessions: refs(&using),
                }),
                Some(p) if !keeps(lun, p) => changes.push(Change {
                    action: '~',
                    object,
                    detail: format!(
                        "{} ({} B blocks) -> {} ({} B blocks): a new store",
                        lun.spec,
                        lun.store.block_size(),
                        p.spec,
                        p.block_size
                    ),
                    effect,
                    sessions: refs(&using),
                }),
                Some(p) => {
                    if let Some(size) = new_size(lun, p) {
                        changes.push(resize_change(object, lun.store.size_bytes(), size, &using));
                    }
                }
            }
        }
        for (&n, p) in planned {
            if !target.luns.contains_key(&n) {
                additions.push(Change {
                    action: '+',
                    object: format!("target {} LUN {n}", target.name),
                    detail: p.spec.clone(),
                    effect: Effect::Free,
                    sessions: Vec::new(),
                });
            }
        }
        if target.allowed_initiators != wanted.allowed_initiators {
            // Sessions of initiators the new list leaves out end: access
            // once refused is refused now, not at their next login.
            let shut_out: Vec<&SessionUse> = users
                .iter()
                .copied()
                .filter(|s| {
                    !wanted.allowed_initiators.is_empty()
                        && !wanted.allowed_initiators.contains(&s.session.initiator)
                })
                .collect();
            changes.push(Change {
                action: '~',
                object: format!("target {} allowed_initiators", target.name),
                detail: format!(
                    "{} -> {}",
                    acl_words(&target.allowed_initiators),
                    acl_words(&wanted.allowed_initiators)
                ),
                effect: if shut_out.is_empty() {
                    Effect::NextLogin
                } else {
                    Effect::EndsSessions
                },
                sessions: refs(&shut_out),
            });
        }
        if chap_words(target) != chap_words(wanted) {
            changes.push(Change {
                action: '~',
                object: format!("target {} chap", target.name),
                detail: format!("{} -> {}", chap_words(target), chap_words(wanted)),
                effect: Effect::NextLogin,
                sessions: Vec::new(),
            });
        } else if !same_secrets(target, wanted) {
            changes.push(Change {
                action: '~',
                object: format!("target {} chap", target.name),
                detail: "secrets changed".into(),
                effect: Effect::NextLogin,
                sessions: Vec::new(),
            });
        }
        limit_changes(&mut changes, &target.name, &target.limits, &wanted.limits);
        if target.alias != wanted.alias {
            changes.push(Change {
                action: '~',
                object: format!("target {} alias", target.name),
                detail: format!("{:?} -> {:?}", target.alias, wanted.alias),
                effect: Effect::NextLogin,
                sessions: Vec::new(),
            });
        }
    }
    for (wanted, planned) in new.config.targets.iter().zip(&new.luns) {
        if !old.targets.iter().any(|t| t.name == wanted.name) {
            let luns: Vec<String> = planned
                .iter()
                .map(|(n, p)| format!("{n}={}", p.spec))
                .collect();
            additions.push(Change {
                action: '+',
                object: format!("target {}", wanted.name),
                detail: format!("LUNs {}", luns.join(", ")),
                effect: Effect::Free,
                sessions: Vec::new(),
            });
        }
    }
    settings(&mut changes, old, &new.config);
    removals.extend(changes);
    removals.extend(additions);
    Plan { changes: removals }
}

/// The QoS limits of target `name` added, removed or changed: free, each
/// changed in place for the commands from then on (`crate::qos`).
fn limit_changes(
    changes: &mut Vec<Change>,
    name: &str,
    old: &[crate::qos::LimitEntry],
    new: &[crate::qos::LimitEntry],
) {
    let mut change = |action, key: &crate::qos::LimitKey, detail: String| {
        changes.push(Change {
            action,
            object: format!("target {name} limit on {key}"),
            detail,
            effect: Effect::Free,
            sessions: Vec::new(),
        });
    };
    for was in old {
        match new.iter().find(|n| n.key == was.key) {
            None => change('-', &was.key, was.spec.to_string()),
            Some(now) if now.spec != was.spec => {
                change('~', &was.key, format!("{} -> {}", was.spec, now.spec));
            }
            Some(_) => {}
        }
    }
    for now in new.iter().filter(|n| !old.iter().any(|o| o.key == n.key)) {
        change('+', &now.key, now.spec.to_string());
    }
}

/// A LUN resized in place: a growth is free (every nexus hears CAPACITY
/// DATA HAS CHANGED), a shrink needs force.
fn resize_change(object: String, old: u64, new: u64, using: &[&SessionUse]) -> Change {
    let grows = new > old;
    Change {
        action: '~',
        object,
        detail: format!(
            "{} from {old} to {new} bytes in place{}",
            if grows { "grows" } else { "shrinks" },
            if using.is_empty() {
                ""
            } else {
                ": CAPACITY DATA HAS CHANGED to its initiators"
            }
        ),
        effect: if grows { Effect::Free } else { Effect::Shrinks },
        sessions: if grows {
            Vec::new()
        } else {
            using.iter().map(|s| s.session.clone()).collect()
        },
    }
}

fn portals(
    removals: &mut Vec<Change>,
    additions: &mut Vec<Change>,
    kind: &str,
    old: &[SocketAddr],
    new: &[SocketAddr],
) {
    for address in old.iter().filter(|a| !new.contains(a)) {
        removals.push(Change {
            action: '-',
            object: format!("{kind} {address}"),
            detail: "no new connections; those made through it stay".into(),
            effect: Effect::Free,
            sessions: Vec::new(),
        });
    }
    for address in new.iter().filter(|a| !old.contains(a)) {
        additions.push(Change {
            action: '+',
            object: format!("{kind} {address}"),
            detail: String::new(),
            effect: Effect::Free,
            sessions: Vec::new(),
        });
    }
}

fn acl_words(list: &[String]) -> String {
    if list.is_empty() {
        "every initiator".into()
    } else {
        format!("[{}]", list.join(", "))
    }
}

/// CHAP in words, secrets left out.
fn chap_words(target: &crate::config::TargetEntry) -> String {
    match &target.chap {
        None => "none".into(),
        Some(chap) => match &chap.mutual {
            None => format!("one-way, user {:?}", chap.initiator.name),
            Some(mutual) => format!(
                "mutual, user {:?}, target user {:?}",
                chap.initiator.name, mutual.name
            ),
        },
    }
}

/// Whether two targets' CHAP secrets (and algorithms) are the same.
fn same_secrets(a: &crate::config::TargetEntry, b: &crate::config::TargetEntry) -> bool {
    let same = |x: &iscsi_proto::login::chap::Credentials,
                y: &iscsi_proto::login::chap::Credentials| {
        x.name == y.name && x.secret == y.secret
    };
    match (&a.chap, &b.chap) {
        (None, None) => true,
        (Some(x), Some(y)) => {
            x.algorithms == y.algorithms
                && same(&x.initiator, &y.initiator)
                && match (&x.mutual, &y.mutual) {
                    (None, None) => true,
                    (Some(m), Some(n)) => same(m, n),
                    _ => false,
                }
        }
        _ => false,
    }
}

/// The settings that apply to every target: new connections and logins
/// take them.
fn settings(changes: &mut Vec<Change>, old: &TargetConfig, new: &TargetConfig) {
    if old.cores != new.cores {
        let words = |c: Option<usize>| c.map_or("one per CPU".to_owned(), |c| c.to_string());
        changes.push(Change {
            action: '~',
            object: "cores".into(),
            detail: format!("{} -> {}", words(old.cores), words(new.cores)),
            effect: Effect::Restart,
            sessions: Vec::new(),
        });
    }
    if old.naa_company_id != new.naa_company_id {
        changes.push(Change {
            action: '~',
            object: "naa_company_id".into(),
            detail: format!("{:#08x} -> {:#08x}", old.naa_company_id, new.naa_company_id),
            effect: Effect::Restart,
            sessions: Vec::new(),
        });
    }
    // A gateway's group and its port in it are read when its RBD LUs open:
    // the keepers and every host's view of the group's ports start then.
    let in_group = !old.gateway_group.is_empty() || !new.gateway_group.is_empty();
    if old.gateway_group != new.gateway_group
        || (in_group && old.portal_group_tag != new.portal_group_tag)
    {
        changes.push(Change {
            action: '~',
            object: "gateway_group".into(),
            detail: format!(
                "{:?} as {} -> {:?} as {}",
                old.gateway_group, old.portal_group_tag, new.gateway_group, new.portal_group_tag
            ),
            effect: Effect::Restart,
            sessions: Vec::new(),
        });
    }
    let mut setting = |name: &str, before: String, after: String| {
        if before != after {
            changes.push(Change {
                action: '~',
                object: name.into(),
                detail: format!("{before} -> {after}"),
                effect: Effect::NextLogin,
                sessions: Vec::new(),
            });
        }
    };
    setting(
        "portal_group_tag",
        old.portal_group_tag.to_string(),
        new.portal_group_tag.to_string(),
    );
    setting(
        "command_window",
        old.command_window.to_string(),
        new.command_window.to_string(),
    );
    setting(
        "nop_in_interval",
        format!("{:?}", old.nop_in_interval),
        format!("{:?}", new.nop_in_interval),
    );
    setting(
        "buffer_pool_bytes",
        old.buffer_pool_bytes.to_string(),
        new.buffer_pool_bytes.to_string(),
    );
    setting(
        "send_buffer_bytes",
        format!("{:?}", old.send_buffer_bytes),
        format!("{:?}", new.send_buffer_bytes),
    );
    let keys: BTreeMap<String, String> = negotiation_words(&old.negotiation);
    let wanted = negotiation_words(&new.negotiation);
    for (key, before) in &keys {
        if let Some(after) = wanted.get(key) {
            setting(&format!("negotiation.{key}"), before.clone(), after.clone());
        }
    }
}

/// The negotiation values a file can set, by their file names.
pub(crate) fn negotiation_words(
    n: &iscsi_proto::text::NegotiationConfig,
) -> BTreeMap<String, String> {
    [
        ("header_digest", format!("{:?}", n.header_digest)),
        ("data_digest", format!("{:?}", n.data_digest)),
        ("max_connections", n.max_connections.to_string()),
        ("initial_r2t", n.initial_r2t.to_string()),
        ("immediate_data", n.immediate_data.to_string()),
        (
            "max_recv_data_segment_length",
            n.max_recv_data_segment_length.to_string(),
        ),
        ("max_burst_length", n.max_burst_length.to_string()),
        ("first_burst_length", n.first_burst_length.to_string()),
        ("default_time2wait", n.default_time2wait.to_string()),
        ("default_time2retain", n.default_time2retain.to_string()),
        ("max_outstanding_r2t", n.max_outstanding_r2t.to_string()),
        ("data_pdu_in_order", n.data_pdu_in_order.to_string()),
        (
            "data_sequence_in_order",
            n.data_sequence_in_order.to_string(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// The session-wide keys a leading login negotiated, by their RFC names.
pub(crate) fn negotiation_words_of(
    p: &iscsi_proto::text::NegotiatedParameters,
) -> BTreeMap<String, String> {
    [
        ("MaxConnections", p.max_connections.to_string()),
        ("InitialR2T", yes_no(p.initial_r2t)),
        ("ImmediateData", yes_no(p.immediate_data)),
        ("MaxBurstLength", p.max_burst_length.to_string()),
        ("FirstBurstLength", p.first_burst_length.to_string()),
        ("DefaultTime2Wait", p.default_time2wait.to_string()),
        ("DefaultTime2Retain", p.default_time2retain.to_string()),
        ("MaxOutstandingR2T", p.max_outstanding_r2t.to_string()),
        ("DataPDUInOrder", yes_no(p.data_pdu_in_order)),
        ("DataSequenceInOrder", yes_no(p.data_sequence_in_order)),
        ("ErrorRecoveryLevel", p.error_recovery_level.to_string()),
        ("RDMAExtensions", yes_no(p.rdma_extensions)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

fn yes_no(b: bool) -> String {
    if b { "Yes" } else { "No" }.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str =
        "listen = [\"127.0.0.1:1\"]\n[[target]]\nname = \"a\"\nluns = [\"ram:1M\"]\n";

    /// The shard count is read at start: a reload says when it applies and
    /// does not need force for it.
    #[test]
    fn a_change_of_cores_applies_at_the_next_start() {
        let old = TargetConfig::from_toml(FILE).unwrap();
        let new = ParsedConfig::parse(&format!("cores = 3\n{FILE}")).unwrap();
        let plan = plan(&old, &new, &[]);
        let change = plan
            .changes
            .iter()
            .find(|c| c.object == "cores")
            .expect("cores listed");
        assert_eq!(change.effect, Effect::Restart);
        assert!(!change.disruptive());
        assert_eq!(
            change.to_string(),
            "~ cores: one per CPU -> 3 (at the next start of the target)"
        );
        let same = ParsedConfig::parse(FILE).unwrap();
        assert!(plan_of(&old, &same).is_empty());
    }

    /// A LUN whose options change is a changed LUN, as any other change
    /// of its specification: a new store, refused without force while a
    /// session uses it; the same options in the same place change nothing.
    #[test]
    fn a_change_of_lun_options_is_a_new_store() {
        let with = |spec: &str| {
            format!("listen = [\"127.0.0.1:1\"]\n[[target]]\nname = \"a\"\nluns = [\"{spec}\"]\n")
        };
        let old = TargetConfig::from_toml(&with("ram:1M,readonly")).unwrap();
        let same = ParsedConfig::parse(&with("ram:1M,readonly")).unwrap();
        assert!(plan_of(&old, &same).is_empty());
        for changed in [
            "ram:1M",
            "ram:1M,readonly,removable",
            "ram:1M,readonly,physical-block=4096",
        ] {
            let new = ParsedConfig::parse(&with(changed)).unwrap();
            let changes = plan_of(&old, &new);
            assert_eq!(changes.len(), 1, "{changed}: {changes:?}");
            assert_eq!(changes[0].action, '~');
            assert_eq!(changes[0].object, "target a LUN 0");
            assert!(
                changes[0].detail.contains("a new store"),
                "{}",
                changes[0].detail
            );
            assert_eq!(changes[0].effect, Effect::Free);
            let using = SessionUse {
                session: SessionRef {
                    tsih: 1,
                    initiator: "iqn.i".into(),
                    isid: "000000000001".into(),
                },
                target: Some("a".into()),
                luns: vec![0],
            };
            let busy = plan(&old, &new, &[using]);
            assert!(busy.changes[0].disruptive(), "{changed} in use needs force");
        }
    }

    /// A gateway group is read at start, as are its members' port ids.
    #[test]
    fn a_change_of_the_gateway_group_applies_at_the_next_start() {
        let grouped =
            |g: &str, tag: u16| format!("portal_group_tag = {tag}\ngateway_group = {g}\n{FILE}");
        let old = TargetConfig::from_toml(&grouped("[1, 2]", 1)).unwrap();
        for (g, tag) in [("[1, 2, 3]", 1), ("[1, 2]", 2)] {
            let new = ParsedConfig::parse(&grouped(g, tag)).unwrap();
            let changes = plan_of(&old, &new);
            let group = changes.iter().find(|c| c.object == "gateway_group");
            let group = group.expect("the group's change is planned");
            assert_eq!(group.effect, Effect::Restart);
            assert!(!group.disruptive());
        }
        let same = ParsedConfig::parse(&grouped("[2, 1]", 1)).unwrap();
        assert!(plan_of(&old, &same).is_empty());
        let none = TargetConfig::from_toml(FILE).unwrap();
        let joined = ParsedConfig::parse(&grouped("[1, 2]", 1)).unwrap();
        assert_eq!(plan_of(&none, &joined)[0].effect, Effect::Restart);
        for bad in ["[2, 3]", "[1]", "[1, 1, 2]"] {
            assert!(ParsedConfig::parse(&grouped(bad, 1)).is_err(), "{bad}");
        }
    }

    /// The company ID is read at start, like cores.
    #[test]
    fn a_change_of_the_naa_company_id_applies_at_the_next_start() {
        let old = TargetConfig::from_toml(FILE).unwrap();
        let new = ParsedConfig::parse(&format!("naa_company_id = 0xACDE48\n{FILE}")).unwrap();
        let changes = plan_of(&old, &new);
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].effect, Effect::Restart);
        assert!(!changes[0].disruptive());
        assert_eq!(changes[0].object, "naa_company_id");
    }

    fn plan_of(old: &TargetConfig, new: &ParsedConfig) -> Vec<Change> {
        plan(old, new, &[]).changes
    }
}
