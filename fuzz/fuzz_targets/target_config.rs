//! The target's configuration file and control socket requests on
//! arbitrary text: parsing never panics, and a file that parses can be
//! planned against a running configuration (the reload's pure step), with
//! its plan printable (a LUN's size changed in the file is a resize in
//! place, a shrink the only change that needs force without sessions).
#![no_main]

use std::sync::OnceLock;

use iscsi_target::control::Request;
use iscsi_target::reload::plan::{Effect, plan};
use iscsi_target::{ParsedConfig, TargetConfig};
use libfuzzer_sys::fuzz_target;

/// A running configuration to plan against (RAM stores only: nothing on
/// disk is created).
fn running() -> &'static TargetConfig {
    static RUNNING: OnceLock<TargetConfig> = OnceLock::new();
    RUNNING.get_or_init(|| {
        TargetConfig::from_toml(
            "listen = [\"127.0.0.1:3260\"]\n[[target]]\nname = \"iqn.2026-11.rs.iscsi:a\"\n\
             allowed_initiators = [\"iqn.x:y\"]\n[target.lun]\n0 = \"ram:1M\"\n3 = \"ram:1M\"\n",
        )
        .expect("the running configuration")
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = Request::parse(text);
    if let Ok(parsed) = ParsedConfig::parse(text) {
        assert_eq!(parsed.luns.len(), parsed.config.targets.len());
        let planned = plan(running(), &parsed, &[]);
        let _ = planned.to_string();
        assert!(
            planned.disruptive().all(|c| c.effect == Effect::Shrinks),
            "no sessions: nothing disrupts but a shrink"
        );
    }
});
