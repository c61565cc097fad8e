//! The libiscsi URL form, `iscsi://[user[%secret]@]host[:port]/target-iqn/lun`
//! (`iser://` for iSER over iWARP, as libiscsi spells it)
//! (also understood by QEMU): the portal (IPv6 addresses in brackets, port
//! 3260 by default, RFC 7143 section 13.8), the target name, the LUN and
//! optional one-way CHAP credentials. `iscsi://host[:port]` alone (or with
//! a trailing `/`) names a portal for discovery.

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// The well-known iSCSI port (RFC 7143 section 13.8, IANA).
pub const DEFAULT_PORT: u16 = 3260;

/// A parsed iSCSI URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IscsiUrl {
    /// Host name or address, without brackets.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// The target's iSCSI name; `None` for a portal-only URL.
    pub target: Option<String>,
    /// The LUN (0 when the URL names none).
    pub lun: u64,
    /// Whether the URL names its LUN (`.../target-iqn/lun`) rather than
    /// leaving it to the default 0: `iscsi ls` lists every LUN unless one
    /// is named.
    pub lun_named: bool,
    /// CHAP user name, if given.
    pub user: Option<String>,
    /// CHAP secret, if given.
    pub secret: Option<String>,
    /// `iser://`: iSCSI Extensions for RDMA (RFC 7145) over iWARP instead
    /// of iSCSI over TCP.
    pub iser: bool,
}

impl IscsiUrl {
    /// `host:port` as a socket address string (IPv6 in brackets).
    pub fn portal(&self) -> String {
        format_portal(&self.host, self.port)
    }

    /// The target name, or an error for a portal-only URL.
    pub fn target_name(&self) -> Result<&str, Error> {
        self.target.as_deref().ok_or_else(|| Error::Url {
            url: self.to_string(),
            reason: "no target name",
        })
    }
}

/// `host:port`, with brackets around an IPv6 address.
pub fn format_portal(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Parses `host[:port]` or `[v6]:port` (as in a TargetAddress value without
/// the portal group tag, or the argument of `iscsi discover`).
pub fn parse_portal(text: &str) -> Option<(String, u16)> {
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        // Brackets hold an IPv6 address and nothing else (RFC 3986 3.2.2).
        host.parse::<std::net::Ipv6Addr>().ok()?;
        let port = match after {
            "" => DEFAULT_PORT,
            p => p.strip_prefix(':')?.parse().ok()?,
        };
        (host.to_owned(), port)
    } else {
        match text.rsplit_once(':') {
            Some((host, _)) if host.contains(':') => return None,
            Some((host, port)) => (host.to_owned(), port.parse().ok()?),
            None => (text.to_owned(), DEFAULT_PORT),
        }
    };
    let forbidden = |c: char| c.is_whitespace() || "[]@/%".contains(c);
    if host.is_empty() || host.contains(forbidden) && !text.starts_with('[') {
        return None;
    }
    Some((host, port))
}

impl FromStr for IscsiUrl {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self, Error> {
        let bad = |reason| Error::Url {
            url: text.to_owned(),
            reason,
        };
        let (rest, iser) = match (text.strip_prefix("iscsi://"), text.strip_prefix("iser://")) {
            (Some(rest), _) => (rest, false),
            (None, Some(rest)) => (rest, true),
            (None, None) => return Err(bad("must start with iscsi:// or iser://")),
        };
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (credentials, portal) = match authority.rsplit_once('@') {
            Some((credentials, portal)) => (Some(credentials), portal),
            None => (None, authority),
        };
        let (user, secret) = match credentials {
            None => (None, None),
            Some(c) => {
                let (user, secret) = match c.split_once('%') {
                    Some((u, s)) => (u, Some(s.to_owned())),
                    None => (c, None),
                };
                if user.is_empty() {
                    return Err(bad("empty user name"));
                }
                (Some(user.to_owned()), secret)
            }
        };
        let (host, port) = parse_portal(portal).ok_or_else(|| bad("bad host or port"))?;
        let path = path.trim_end_matches('/');
        let (target, lun) = if path.is_empty() {
            (None, None)
        } else {
            let (target, lun) = match path.rsplit_once('/') {
                Some((target, lun)) => (
                    target,
                    Some(lun.parse::<u64>().map_err(|_| bad("LUN is not a number"))?),
                ),
                None => (path, None),
            };
            if target.is_empty() || target.contains('/') {
                return Err(bad("bad target name"));
            }
            (Some(target.to_owned()), lun)
        };
        let (lun, lun_named) = (lun.unwrap_or(0), lun.is_some());
        if lun > 16383 {
            return Err(bad("LUN above 16383"));
        }
        Ok(IscsiUrl {
            iser,
            host,
            port,
            target,
            lun,
            lun_named,
            user,
            secret,
        })
    }
}

impl fmt::Display for IscsiUrl {
    /// The URL, with the secret masked.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", if self.iser { "iser://" } else { "iscsi://" })?;
        if let Some(user) = &self.user {
            write!(f, "{user}")?;
            if self.secret.is_some() {
                write!(f, "%***")?;
            }
            write!(f, "@")?;
        }
        write!(f, "{}", self.portal())?;
        if let Some(target) = &self.target {
            write!(f, "/{target}/{}", self.lun)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iser_urls() {
        let url: IscsiUrl = "iser://10.0.0.1:3262/iqn.2026-11.x:t/1".parse().unwrap();
        assert!(url.iser);
        assert_eq!((url.port, url.lun), (3262, 1));
        assert_eq!(url.to_string(), "iser://10.0.0.1:3262/iqn.2026-11.x:t/1");
        let tcp: IscsiUrl = "iscsi://10.0.0.1/iqn.2026-11.x:t/1".parse().unwrap();
        assert!(!tcp.iser);
        assert!("rdma://h/t/0".parse::<IscsiUrl>().is_err());
    }

    #[test]
    fn full_form() {
        let url: IscsiUrl = "iscsi://alice%s3cret@10.0.0.1:3299/iqn.2026-11.x:t/3"
            .parse()
            .unwrap();
        assert_eq!(url.host, "10.0.0.1");
        assert_eq!(url.port, 3299);
        assert_eq!(url.target.as_deref(), Some("iqn.2026-11.x:t"));
        assert_eq!(url.lun, 3);
        assert_eq!(url.user.as_deref(), Some("alice"));
        assert_eq!(url.secret.as_deref(), Some("s3cret"));
        assert_eq!(
            url.to_string(),
            "iscsi://alice%***@10.0.0.1:3299/iqn.2026-11.x:t/3"
        );
    }

    #[test]
    fn a_lun_is_named_only_after_the_target() {
        for (url, named) in [
            ("iscsi://127.0.0.1:3260/iqn.2026-11.rs.iscsi:t/7", true),
            ("iscsi://u%s@[::1]/iqn.2026-11.rs.iscsi:t/0/", true),
            ("iscsi://127.0.0.1:3260/iqn.2026-11.rs.iscsi:t", false),
            ("iscsi://127.0.0.1:3260/iqn.2026-11.rs.iscsi:t/", false),
            ("iser://127.0.0.1", false),
        ] {
            let parsed: IscsiUrl = url.parse().unwrap();
            assert_eq!(parsed.lun_named, named, "{url}");
        }
    }

    #[test]
    fn defaults_and_ipv6() {
        let url: IscsiUrl = "iscsi://[::1]/iqn.a:b/0".parse().unwrap();
        assert_eq!((url.host.as_str(), url.port), ("::1", DEFAULT_PORT));
        assert_eq!(url.portal(), "[::1]:3260");
        let url: IscsiUrl = "iscsi://[fe80::1]:3300/iqn.a:b".parse().unwrap();
        assert_eq!((url.port, url.lun, url.lun_named), (3300, 0, false));
        let portal: IscsiUrl = "iscsi://host.example".parse().unwrap();
        assert_eq!(portal.target, None);
        assert!(portal.target_name().is_err());
    }

    #[test]
    fn rejects_bad_urls() {
        for bad in [
            "http://h/t/0",
            "iscsi://",
            "iscsi://h:notaport/t/0",
            "iscsi://h/t/x",
            "iscsi://::1/t/0",
            "iscsi://[::1/t/0",
            "iscsi://[[]/5",
            "iscsi://[h]/t/0",
            "iscsi://h]/t/0",
            "iscsi://@h/t/0",
            "iscsi://h/t/99999",
        ] {
            assert!(bad.parse::<IscsiUrl>().is_err(), "{bad}");
        }
    }
}
