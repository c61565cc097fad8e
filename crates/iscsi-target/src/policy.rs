//! The login decisions the protocol core asks the driver for
//! (`LoginPolicy`): which target a login names, whether the initiator may
//! log in, and which session the connection starts.

use std::sync::Arc;

use arc_swap::ArcSwap;
use std::sync::atomic::{AtomicU16, Ordering};

use iscsi_proto::login::target::{LoginPolicy, LoginRefusal, SessionRequest, TargetSettings};
use iscsi_proto::text::SessionType;

use crate::config::TargetConfig;
use crate::registry::Registry;

/// The policy of one running target.
pub(crate) struct Policy {
    /// The configuration served now (shared with `Shared`, replaced by
    /// a reload).
    config: Arc<ArcSwap<TargetConfig>>,
    sessions: Arc<Registry>,
    next_tsih: AtomicU16,
}

impl Policy {
    pub fn new(config: Arc<ArcSwap<TargetConfig>>, sessions: Arc<Registry>) -> Self {
        Policy {
            config,
            sessions,
            next_tsih: AtomicU16::new(1),
        }
    }

    /// A fresh TSIH: never 0 (RFC 7143 11.12.6: 0 means "new session") and
    /// not in use by a running session.
    fn allocate_tsih(&self) -> u16 {
        loop {
            let tsih = self.next_tsih.fetch_add(1, Ordering::Relaxed);
            if tsih != 0 && !self.sessions.contains(tsih) {
                return tsih;
            }
        }
    }
}

impl LoginPolicy for Policy {
    fn settings(&self, request: &SessionRequest) -> Result<TargetSettings, LoginRefusal> {
        // One snapshot for the whole decision: a reload meanwhile does not
        // mix two configurations in one answer.
        let config = self.config.load();
        let find = |name: &str| config.targets.iter().find(|t| t.name == name);
        let target = match request.session_type {
            SessionType::Discovery => None,
            SessionType::Normal => {
                let name = request
                    .target_name
                    .as_deref()
                    .ok_or_else(|| LoginRefusal::missing_key("TargetName"))?;
                Some(find(name).ok_or_else(|| LoginRefusal::unknown_target(name))?)
            }
        };
        if let Some(target) = target
            && !target.allowed_initiators.is_empty()
            && !target.allowed_initiators.contains(&request.initiator_name)
        {
            return Err(LoginRefusal::not_in_acl(
                &request.initiator_name,
                &target.name,
            ));
        }
        let mut negotiation = config.negotiation.clone();
        negotiation.declarations = config.declarations(target);
        let chap = target.and_then(|t| t.chap.clone());
        if request.tsih == 0 {
            return Ok(TargetSettings {
                negotiation,
                chap,
                tsih: self.allocate_tsih(),
                leading: true,
                command_window: config.command_window,
            });
        }
        // A connection joining a running session (RFC 7143 6.3.3): same
        // initiator, ISID and target, and room under MaxConnections.
        let session = self
            .sessions
            .get(request.tsih)
            .filter(|s| {
                s.initiator_name == request.initiator_name
                    && s.isid == request.isid
                    && s.target_name == request.target_name
            })
            .ok_or_else(|| LoginRefusal::session_does_not_exist(request.tsih))?;
        // A login with a CID in use reinstates that connection (RFC 7143
        // 6.3.4): it replaces one, adds none.
        let max = u32::from(session.params.max_connections);
        if !session.has_cid(request.cid) && session.connection_count() >= max {
            return Err(LoginRefusal::too_many_connections(request.tsih, max));
        }
        Ok(TargetSettings {
            negotiation,
            chap,
            tsih: request.tsih,
            leading: false,
            command_window: config.command_window,
        })
    }
}
