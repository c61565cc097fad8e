//! Test support shared by this crate's tests: a login that accepts
//! whatever the initiator offers (for the fake targets), and `iscsi target`
//! itself on loopback.
#![allow(dead_code)]

use std::sync::Arc;

use iscsi_scsi::Backstore;
use iscsi_target::{Server, TargetConfig, TargetEntry};
use tokio::sync::oneshot;

use iscsi_datamover::tcp::TcpDatamover;
use iscsi_datamover::{DatamoverError, PduSender};
use iscsi_proto::pdu::login::{LoginRequest, LoginResponse, LoginStage, LoginStatus};
use iscsi_proto::pdu::{Header, Pdu};
use iscsi_proto::serial::StatSn;
use iscsi_proto::text::codec;

/// Answers one Login Request by echoing the initiator's offers (AuthMethod
/// None in the security stage), with a command window of `window` CmdSNs;
/// `overrides` replace the echoed value of a key (a target's declaration
/// such as its own MaxRecvDataSegmentLength).
pub async fn answer_login(
    dm: &mut TcpDatamover,
    request: &LoginRequest,
    data: &[u8],
    stat_sn: &mut StatSn,
    window: u32,
    overrides: &[(&str, &str)],
) -> Result<(), DatamoverError> {
    let pairs = codec::parse(data).unwrap_or_default();
    let mut answers: Vec<_> = pairs
        .into_iter()
        .filter(|p| {
            !matches!(
                p.key.as_str(),
                "InitiatorName" | "TargetName" | "SessionType" | "InitiatorAlias"
            )
        })
        .collect();
    if request.current_stage == LoginStage::SecurityNegotiation {
        answers.retain(|p| p.key == "AuthMethod");
        for p in &mut answers {
            p.value = "None".into();
        }
    }
    for p in &mut answers {
        if let Some((_, value)) = overrides.iter().find(|(key, _)| *key == p.key) {
            p.value = (*value).into();
        }
    }
    let mut text = Vec::new();
    codec::encode(&answers, &mut text);
    let response = LoginResponse {
        transit: request.transit,
        continue_flag: false,
        current_stage: request.current_stage,
        next_stage: request.next_stage,
        version_max: 0,
        version_active: 0,
        isid: request.isid,
        tsih: 7,
        initiator_task_tag: request.initiator_task_tag,
        stat_sn: *stat_sn,
        exp_cmd_sn: request.cmd_sn,
        max_cmd_sn: request.cmd_sn.wrapping_add(window - 1),
        status: LoginStatus::SUCCESS,
    };
    *stat_sn = stat_sn.next();
    let header = Header::new(Pdu::LoginResponse(response), text.len() as u32);
    dm.sender.send_control(&header, &text).await
}

/// `iscsi target` serving `luns` as `name` on a TCP and an iSER portal of
/// 127.0.0.1, granting a command window of `command_window`: returns both
/// addresses and the sender that stops it.
pub async fn our_target(
    name: &str,
    luns: Vec<Arc<dyn Backstore>>,
    command_window: u32,
) -> (String, String, oneshot::Sender<()>) {
    let config = TargetConfig {
        listen: vec!["127.0.0.1:0".parse().unwrap()],
        iser: vec!["127.0.0.1:0".parse().unwrap()],
        targets: vec![TargetEntry {
            name: name.to_owned(),
            alias: None,
            luns: iscsi_target::numbered(luns),
            chap: None,
            allowed_initiators: Vec::new(),
            limits: Vec::new(),
        }],
        portal_group_tag: 1,
        gateway_group: Vec::new(),
        negotiation: TargetConfig::default_negotiation(),
        command_window,
        nop_in_interval: None,
        buffer_pool_bytes: iscsi_target::DEFAULT_BUFFER_POOL_BYTES,
        send_buffer_bytes: Some(iscsi_target::DEFAULT_SEND_BUFFER_BYTES),
        cores: Some(2),
        naa_company_id: iscsi_scsi::spc::NAA_COMPANY_ID,
        tap: None,
    };
    let server = Server::bind(config).await.unwrap();
    let tcp = server.local_addrs()[0];
    let iser = server.iser_addrs()[0];
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(server.run_until(async {
        let _ = stopped.await;
    }));
    (tcp.to_string(), iser.to_string(), stop)
}

/// `iscsi target` from a configuration file's text, on this runtime; the
/// server stops when the returned sender is used or dropped.
pub async fn start_from_toml(text: &str) -> (iscsi_target::ServerHandle, oneshot::Sender<()>) {
    let config = TargetConfig::from_toml(text).expect("the configuration file");
    let server = Server::bind(config).await.expect("bind");
    let handle = server.handle();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(server.run_until(async {
        let _ = stopped.await;
    }));
    (handle, stop)
}

/// A session of our initiator to LUN 0's target `target` on
/// 127.0.0.1:`port`, with `config` (its name and ISID; the default for one
/// anonymous session).
pub async fn login(
    port: u16,
    target: &str,
    config: iscsi_initiator::SessionConfig,
) -> Arc<iscsi_initiator::Session> {
    let url: iscsi_initiator::IscsiUrl = format!("iscsi://127.0.0.1:{port}/{target}/0")
        .parse()
        .expect("a URL");
    Arc::new(
        iscsi_initiator::Session::connect(&url, config)
            .await
            .expect("login"),
    )
}

/// [`login`] as initiator `name` with ISID 80 00 00 00 00 `isid`.
pub async fn login_as(
    port: u16,
    target: &str,
    name: &str,
    isid: u8,
) -> Arc<iscsi_initiator::Session> {
    let config = iscsi_initiator::SessionConfig {
        initiator_name: name.to_owned(),
        isid: Some([0x80, 0, 0, 0, 0, isid]),
        ..iscsi_initiator::SessionConfig::default()
    };
    login(port, target, config).await
}

/// 64 KiB that differ with `seed`, for writes whose reads are compared.
pub fn pattern(seed: u8) -> Vec<u8> {
    (0..65536u32)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// A configuration file with one portal on `port` (no NOP-Ins) and one
/// target `name` whose `[target.lun]` table is `luns`.
pub fn one_target(port: u16, name: &str, luns: &str) -> String {
    format!(
        "listen = [\"127.0.0.1:{port}\"]\nnop_in_interval_seconds = 0\n\
         [[target]]\nname = \"{name}\"\n[target.lun]\n{luns}"
    )
}

/// A write-then-read-back loop on one LUN, run in the background while a
/// test changes the target under it: 64 KiB at a time over 64 places
/// from `first_lba`, each read compared with what was written.
pub struct VerifiedIo {
    stop: Arc<std::sync::atomic::AtomicBool>,
    verified: Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<Result<(), iscsi_initiator::Error>>,
}

impl VerifiedIo {
    /// Starts the loop on LUN `lun` of `session` (512-byte blocks).
    pub fn start(session: Arc<iscsi_initiator::Session>, lun: u64, first_lba: u64) -> VerifiedIo {
        use std::sync::atomic::Ordering;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let verified = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (flag, count) = (Arc::clone(&stop), Arc::clone(&verified));
        let task = tokio::spawn(async move {
            let mut round = 0u64;
            while !flag.load(Ordering::Relaxed) {
                let lba = first_lba + (round % 64) * 128;
                let data = pattern((round % 251) as u8);
                session.write(lun, lba, 512, &data).await?;
                let back = session.read(lun, lba, 512, vec![0; data.len()]).await?;
                assert_eq!(back, data, "LUN {lun} at LBA {lba}");
                count.fetch_add(1, Ordering::Relaxed);
                round += 1;
            }
            Ok(())
        });
        VerifiedIo {
            stop,
            verified,
            task,
        }
    }

    /// Round trips verified so far.
    pub fn verified(&self) -> u64 {
        self.verified.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stops the loop: its first error, and how many round trips it
    /// verified.
    pub async fn stop(self) -> (Result<(), iscsi_initiator::Error>, u64) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let result = self.task.await.expect("the I/O task");
        (
            result,
            self.verified.load(std::sync::atomic::Ordering::Relaxed),
        )
    }
}
