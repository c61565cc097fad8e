//! Target Transfer Tags of one connection (RFC 7143 11.2.1.8): R2Ts and
//! long Text answers each get one, so the initiator's reply names what
//! it answers. 0xffffffff is reserved; the tags cycle through
//! 1..=0x7fffffff, so one never collides with the reserved value and a
//! tag comes back only after two billion others.

/// Hands out a connection's Target Transfer Tags.
#[derive(Clone, Debug)]
pub struct TransferTags {
    next: u32,
}

impl Default for TransferTags {
    fn default() -> Self {
        TransferTags { next: 1 }
    }
}

impl TransferTags {
    /// The next tag.
    pub fn take(&mut self) -> u32 {
        let tag = self.next;
        self.next = (self.next % 0x7FFF_FFFF) + 1;
        tag
    }
}

#[cfg(test)]
mod tests {
    use super::TransferTags;

    #[test]
    fn tags_cycle_below_the_reserved_value_and_skip_zero() {
        let mut tags = TransferTags::default();
        assert_eq!((tags.take(), tags.take()), (1, 2));
        tags.next = 0x7FFF_FFFF;
        assert_eq!((tags.take(), tags.take()), (0x7FFF_FFFF, 1));
    }
}
