//! The initiator's parsers of untrusted text: libiscsi-style URLs (from a
//! user or a script) and a target's SendTargets answer (from the network).
//! Neither panics; a URL that parses prints (secret masked) to one that
//! parses to the same host, port, target, LUN and user.
#![no_main]

use iscsi_initiator::IscsiUrl;
use iscsi_initiator::discovery::parse_send_targets;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = parse_send_targets(data);
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(url) = text.parse::<IscsiUrl>()
    {
        let again: IscsiUrl = url.to_string().parse().expect("a printed URL parses");
        assert_eq!(
            (&again.host, again.port, &again.target, again.lun, &again.user),
            (&url.host, url.port, &url.target, url.lun, &url.user)
        );
        assert_eq!(again.secret.is_some(), url.secret.is_some());
    }
});
