//! The login decisions the protocol core asks the driver for
//! (`LoginPolicy`): which target a login names, whether the initiator may
//! log in, and which session the connection starts.

use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};

use iscsi_proto::login::target::{LoginPolicy, SessionRequest, TargetSettings};
use iscsi_proto::pdu::login::LoginStatus;
use iscsi_proto::text::SessionType;

use crate::config::{TargetConfig, TargetEntry};

/// The policy of one running target.
pub(crate) struct Policy {
    config: Arc<TargetConfig>,
    next_tsih: AtomicU16,
}

impl Policy {
    pub fn new(config: Arc<TargetConfig>) -> Self {
        Policy {
            config,
            next_tsih: AtomicU16::new(1),
        }
    }

    /// The configured target with this name.
    pub fn target(&self, name: &str) -> Option<&TargetEntry> {
        self.config.targets.iter().find(|t| t.name == name)
    }

    /// A fresh TSIH: never 0 (RFC 7143 11.12.6: 0 means "new session").
    fn allocate_tsih(&self) -> u16 {
        loop {
            let tsih = self.next_tsih.fetch_add(1, Ordering::Relaxed);
            if tsih != 0 {
                return tsih;
            }
        }
    }
}

impl LoginPolicy for Policy {
    fn settings(&self, request: &SessionRequest) -> Result<TargetSettings, LoginStatus> {
        let target = match request.session_type {
            SessionType::Discovery => None,
            SessionType::Normal => {
                let name = request
                    .target_name
                    .as_deref()
                    .ok_or(LoginStatus::MISSING_PARAMETER)?;
                Some(self.target(name).ok_or(LoginStatus::NOT_FOUND)?)
            }
        };
        if let Some(target) = target
            && !target.allowed_initiators.is_empty()
            && !target.allowed_initiators.contains(&request.initiator_name)
        {
            return Err(LoginStatus::AUTHORIZATION_FAILURE);
        }
        // One connection per session (MaxConnections=1): a login naming an
        // existing session cannot be placed.
        if request.tsih != 0 {
            return Err(LoginStatus::SESSION_DOES_NOT_EXIST);
        }
        let mut negotiation = self.config.negotiation.clone();
        negotiation.declarations = self.config.declarations(target);
        Ok(TargetSettings {
            negotiation,
            chap: target.and_then(|t| t.chap.clone()),
            tsih: self.allocate_tsih(),
            leading: true,
            command_window: self.config.command_window,
        })
    }
}
