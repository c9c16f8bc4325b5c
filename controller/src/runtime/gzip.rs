//! The gzip-compressed JSON the leader persists in ConfigMaps of its namespace (the evidence claims,
//! the protect gate's edge history): compressed fast, read back with a bound, so that a damaged or
//! hostile ConfigMap cannot make the controller inflate without end.

use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use std::io::{Read as _, Write as _};

/// `json` compressed (gzip, fast). `ratio`: the expected compression, to size the buffer once.
pub fn compress(json: &[u8], ratio: usize) -> Vec<u8> {
    let mut gz = GzEncoder::new(
        Vec::with_capacity(json.len() / ratio.max(1)),
        Compression::fast(),
    );
    // Writing into a Vec cannot fail.
    let _ = gz.write_all(json);
    gz.finish().unwrap_or_default()
}

/// `bytes` decompressed, at most `max` bytes; an error says why not (not gzip, or larger).
pub fn decompress(bytes: &[u8], max: u64) -> Result<Vec<u8>, String> {
    let mut json = Vec::new();
    GzDecoder::new(bytes)
        .take(max + 1)
        .read_to_end(&mut json)
        .map_err(|e| format!("not gzip: {e}"))?;
    if json.len() as u64 > max {
        return Err(format!("larger than {max} bytes decompressed"));
    }
    Ok(json)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_compressed_comes_back_within_its_bound_and_nothing_else_does() {
        let json = br#"{"format": 1, "claims": []}"#.repeat(100);
        let bytes = compress(&json, 4);
        assert!(bytes.len() < json.len() / 4, "{} bytes", bytes.len());
        assert_eq!(decompress(&bytes, json.len() as u64), Ok(json.clone()));
        assert_eq!(
            decompress(&bytes, 100),
            Err("larger than 100 bytes decompressed".to_string())
        );
        assert!(
            decompress(b"not gzip", 100)
                .unwrap_err()
                .starts_with("not gzip")
        );
    }
}
