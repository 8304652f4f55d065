//! Choosing a MIME type for an output file.

/// How many leading bytes [`content_type`] needs to recognise a format by its magic bytes.
pub const SNIFF_LEN: usize = 8 * 1024;

const UNKNOWN: &str = "application/octet-stream";

/// A MIME type for a file: by its name's extension, else by the magic bytes at the start of
/// its content (`head`), else `application/octet-stream`.
pub fn content_type(name: &str, head: &[u8]) -> String {
    if let Some(by_name) = mime_guess::from_path(name).first_raw() {
        return by_name.to_owned();
    }
    infer::get(head).map_or(UNKNOWN, |t| t.mime_type()).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn by_name_then_magic_then_unknown() {
        assert_eq!(content_type("dir/r.json", b"{}"), "application/json");
        assert_eq!(content_type("image", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR"), "image/png");
        assert_eq!(content_type("blob", b"\x01\x02\x03"), UNKNOWN);
        assert_eq!(content_type("empty", b""), UNKNOWN);
    }
}
