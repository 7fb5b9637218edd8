//! Whether a request whose replica gave no answer goes to another one.
//! Only failures before the answer's first byte count: after that the
//! client has part of an answer, and it ends where the replica stopped.

/// How sending a request to a replica failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendFailure {
    /// The connection was refused: the replica got nothing.
    Refused,
    /// The replica took the request and dropped the connection before its
    /// answer began (killed or restarted mid-generation).
    Dropped,
    /// Anything else (a timeout, a malformed answer): not retried.
    Other,
}

/// Most retries after refused connections (one per other endpoint, in practice).
pub const MAX_REFUSED_RETRIES: u32 = 3;
/// Most retries after a dropped request. A completion has no side effect to
/// repeat, but a request that kills its replica must not take them all.
pub const MAX_DROPPED_RETRIES: u32 = 1;

/// The retries one request has used.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Retries {
    refused: u32,
    dropped: u32,
}

impl Retries {
    /// Counts `failure`; true when the request may go to another replica.
    pub fn allow(&mut self, failure: SendFailure) -> bool {
        let (used, most) = match failure {
            SendFailure::Refused => (&mut self.refused, MAX_REFUSED_RETRIES),
            SendFailure::Dropped => (&mut self.dropped, MAX_DROPPED_RETRIES),
            SendFailure::Other => return false,
        };
        *used += 1;
        *used <= most
    }
}

#[cfg(test)]
mod tests {
    use super::SendFailure::{Dropped, Other, Refused};
    use super::*;

    #[test]
    fn each_failure_has_its_own_budget() {
        // (failures in order, whether each may be retried)
        let cases: &[(&[SendFailure], &[bool])] = &[
            (&[Other], &[false]),
            (
                &[Refused, Refused, Refused, Refused],
                &[true, true, true, false],
            ),
            (&[Dropped, Dropped], &[true, false]),
            (
                &[Refused, Dropped, Refused, Dropped],
                &[true, true, true, false],
            ),
            (&[Dropped, Other], &[true, false]),
        ];
        for (failures, want) in cases {
            let mut r = Retries::default();
            let got: Vec<bool> = failures.iter().map(|f| r.allow(*f)).collect();
            assert_eq!(&got, want, "{failures:?}");
        }
    }
}
