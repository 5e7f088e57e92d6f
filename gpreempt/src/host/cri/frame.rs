//! gRPC's length-prefixed message framing: every message on a gRPC stream is one byte of
//! compressed flag, a 4-byte big-endian length, then the protobuf bytes
//! (grpc/grpc `doc/PROTOCOL-HTTP2.md`, "Length-Prefixed-Message"). The CRI client never asks for
//! compression (it sends no `grpc-accept-encoding`), so a compressed message is refused.

use bytes::{BufMut, Bytes, BytesMut};

/// The prefix's size: the compressed flag and the length.
pub const PREFIX_LEN: usize = 5;

/// Why a gRPC message body is not one uncompressed message.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("{0} bytes is shorter than the 5-byte gRPC message prefix")]
    Short(usize),
    #[error("the message is compressed (flag {0}), which was not asked for")]
    Compressed(u8),
    #[error("the prefix declares {declared} bytes but {available} follow it")]
    Length { declared: usize, available: usize },
}

/// `message` framed as one uncompressed gRPC message.
pub fn encode(message: &impl prost::Message) -> Bytes {
    let body = message.encode_to_vec();
    let mut out = BytesMut::with_capacity(PREFIX_LEN + body.len());
    out.put_u8(0);
    // A CRI request is far below 4 GiB; a larger one would be refused by the runtime's limit
    // (16 MiB in containerd) long before the length wrapped.
    out.put_u32(u32::try_from(body.len()).unwrap_or(u32::MAX));
    out.extend_from_slice(&body);
    out.freeze()
}

/// The protobuf bytes of the one message a unary response body holds.
pub fn decode(body: &[u8]) -> Result<&[u8], FrameError> {
    let Some((prefix, rest)) = body.split_first_chunk::<PREFIX_LEN>() else {
        return Err(FrameError::Short(body.len()));
    };
    if prefix[0] != 0 {
        return Err(FrameError::Compressed(prefix[0]));
    }
    let declared = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
    if declared != rest.len() {
        return Err(FrameError::Length { declared, available: rest.len() });
    }
    Ok(rest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::cri::messages::VersionRequest;

    #[test]
    fn frames_and_unframes_one_message() {
        let framed = encode(&VersionRequest { version: "v1".into() });
        // Field 1 (string, wire type 2): tag 0x0a, length 2, "v1".
        assert_eq!(&framed[..], &[0, 0, 0, 0, 4, 0x0a, 2, b'v', b'1']);
        assert_eq!(decode(&framed), Ok(&[0x0a, 2, b'v', b'1'][..]));
        // An empty message is a bare prefix.
        assert_eq!(&encode(&VersionRequest::default())[..], &[0, 0, 0, 0, 0]);
        assert_eq!(decode(&[0, 0, 0, 0, 0]), Ok(&[][..]));
    }

    #[test]
    fn refuses_what_is_not_one_uncompressed_message() {
        assert_eq!(decode(&[0, 0, 0]), Err(FrameError::Short(3)));
        assert_eq!(decode(&[1, 0, 0, 0, 1, 7]), Err(FrameError::Compressed(1)));
        assert_eq!(decode(&[0, 0, 0, 0, 3, 7]), Err(FrameError::Length { declared: 3, available: 1 }));
        assert_eq!(decode(&[0, 0, 0, 0, 1, 7, 8]), Err(FrameError::Length { declared: 1, available: 2 }));
        assert_eq!(
            FrameError::Length { declared: 3, available: 1 }.to_string(),
            "the prefix declares 3 bytes but 1 follow it"
        );
    }
}
