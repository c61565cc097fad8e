//! Saying plainly that a URL names a LUN the target does not have.
//!
//! SPC-4 gives a LUN that does not exist two answers: INQUIRY returns data
//! with PERIPHERAL QUALIFIER 011b and device type 1Fh (§6.6.2), and every
//! other command ends with CHECK CONDITION, ILLEGAL REQUEST / LOGICAL UNIT
//! NOT SUPPORTED (25h/00h); `iscsi target` answers both ways. Someone who
//! typed `/7` for `/0` should read "LUN 7: logical unit not supported" and
//! which LUNs there are, not a bare sense code, nor INQUIRY data of device
//! type "unknown" with exit status 0.

use anyhow::anyhow;
use iscsi_initiator::{Error, InquiryData, Session};
use iscsi_scsi::{Asc, SenseKey};

/// PERIPHERAL QUALIFIER 011b: the device server cannot support a device
/// on this LUN (SPC-4 §6.6.2).
const QUALIFIER_NOT_SUPPORTED: u8 = 0b011;

/// `result` of `what`, a command sent to `lun`, with `what` as context; a
/// target's answer that `lun` does not exist is said first (with the LUNs
/// it has), the command and its sense data after.
pub async fn checked<T>(
    session: &Session,
    lun: u64,
    what: &str,
    result: Result<T, Error>,
) -> anyhow::Result<T> {
    match result {
        Ok(value) => Ok(value),
        Err(error) => {
            let missing = is_lun_not_supported(&error);
            let error = anyhow::Error::new(error).context(what.to_owned());
            if missing {
                Err(error.context(headline(lun, session.report_luns().await.ok())))
            } else {
                Err(error)
            }
        }
    }
}

/// An error if `inquiry` is the answer for a LUN that does not exist
/// (peripheral qualifier 011b).
pub async fn check_inquiry(
    session: &Session,
    lun: u64,
    inquiry: &InquiryData,
) -> anyhow::Result<()> {
    if inquiry.peripheral_qualifier != QUALIFIER_NOT_SUPPORTED {
        return Ok(());
    }
    let luns = session.report_luns().await.ok();
    let detail = anyhow!(
        "INQUIRY: peripheral qualifier {}, device type {:#04x} (no logical unit)",
        inquiry.peripheral_qualifier,
        inquiry.device_type
    );
    Err(detail.context(headline(lun, luns)))
}

/// "LUN 7: logical unit not supported (the target has LUN 0)"; the list is
/// left out when REPORT LUNS failed too.
pub fn headline(lun: u64, luns: Option<Vec<u64>>) -> String {
    let has = match luns.as_deref() {
        None => String::new(),
        Some([]) => " (the target has no LUNs)".to_owned(),
        Some([one]) => format!(" (the target has LUN {one})"),
        Some(many) => {
            let list: Vec<String> = many.iter().map(u64::to_string).collect();
            format!(" (the target has LUNs {})", list.join(", "))
        }
    };
    format!("LUN {lun}: logical unit not supported{has}")
}

/// CHECK CONDITION with ILLEGAL REQUEST / LOGICAL UNIT NOT SUPPORTED.
fn is_lun_not_supported(error: &Error) -> bool {
    let Error::Status {
        sense: Some(sense), ..
    } = error
    else {
        return false;
    };
    sense.key == SenseKey::IllegalRequest.code()
        && Asc::new(sense.asc, sense.ascq) == Asc::LOGICAL_UNIT_NOT_SUPPORTED
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_headline_lists_the_luns_there_are() {
        assert_eq!(
            headline(7, Some(vec![0])),
            "LUN 7: logical unit not supported (the target has LUN 0)"
        );
        assert_eq!(
            headline(2, Some(vec![0, 1])),
            "LUN 2: logical unit not supported (the target has LUNs 0, 1)"
        );
        assert_eq!(headline(7, None), "LUN 7: logical unit not supported");
    }

    #[test]
    fn only_25h_00h_means_no_such_lun() {
        let status = |key: u8, asc: u8| Error::Status {
            status: 0x02,
            sense: iscsi_initiator::Sense::parse(&[0x72, key, asc, 0, 0, 0, 0, 0]),
        };
        assert!(is_lun_not_supported(&status(0x05, 0x25)));
        assert!(!is_lun_not_supported(&status(0x05, 0x24)));
        assert!(!is_lun_not_supported(&status(0x06, 0x25)));
        assert!(!is_lun_not_supported(&Error::ConnectionLost));
    }
}
