//! Fuzzing of the frame header a peer's bytes go through before any handler sees them
//! ([`decode_header`]). The messages inside frames are fuzzed by the crates that define them.

use proptest::prelude::*;

use super::{FRAME_VERSION, HEADER_LEN, MAX_FRAME_LEN, decode_header, encode_header};

fn header() -> impl Strategy<Value = [u8; HEADER_LEN]> {
    let version = prop_oneof![Just(FRAME_VERSION), any::<u8>()];
    let max = u32::try_from(MAX_FRAME_LEN).expect("the frame limit fits a u32");
    let len = prop_oneof![0..=max, max - 2..=max + 2, any::<u32>()];
    (version, len).prop_map(|(version, len)| {
        let [a, b, c, d] = len.to_be_bytes();
        [version, a, b, c, d]
    })
}

proptest! {
    /// A header is accepted exactly when it has our version and a length within the limit,
    /// and then it announces that length.
    #[test]
    fn a_header_is_accepted_only_with_our_version_within_the_limit(header in header()) {
        let [version, len @ ..] = header;
        let len = u32::from_be_bytes(len) as usize;
        match decode_header(header) {
            Ok(announced) => {
                prop_assert_eq!(version, FRAME_VERSION);
                prop_assert_eq!(announced, len);
                prop_assert!(announced <= MAX_FRAME_LEN);
            }
            Err(reason) => {
                prop_assert!(version != FRAME_VERSION || len > MAX_FRAME_LEN, "{}", reason);
            }
        }
    }

    /// What one side writes the other reads back; a frame over the limit is never written.
    #[test]
    fn headers_round_trip_up_to_the_limit(len in prop_oneof![0..=MAX_FRAME_LEN, MAX_FRAME_LEN..]) {
        match encode_header(len) {
            Ok(header) => prop_assert_eq!(decode_header(header), Ok(len)),
            Err(_) => prop_assert!(len > MAX_FRAME_LEN),
        }
    }
}
