//! Resource URIs: cordon's own `cordon://<tool>/<percent-encoded URI>`
//! form, and RFC 6570 URI templates matched against concrete URIs (used by
//! the routing in [`crate::resources`] and by each server's listing).

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

/// The scheme of cordon's own resource URIs.
pub const SCHEME: &str = "cordon://";

/// Everything but the RFC 3986 unreserved characters is encoded, so the
/// original URI is one path segment.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `cordon://<tool>/<percent-encoded uri>`.
pub fn cordon_uri(tool: &str, uri: &str) -> String {
    format!("{SCHEME}{tool}/{}", utf8_percent_encode(uri, SEGMENT))
}

/// `Some((tool, original uri))` for a `cordon://` URI; `Err` when it is one
/// but malformed.
pub fn parse_cordon_uri(uri: &str) -> Option<Result<(String, String), String>> {
    let rest = uri.strip_prefix(SCHEME)?;
    let Some((tool, enc)) = rest.split_once('/') else {
        return Some(Err(format!(
            "`{uri}`: a cordon resource URI is cordon://<tool>/<percent-encoded URI>"
        )));
    };
    Some(
        percent_decode_str(enc)
            .decode_utf8()
            .map(|u| (tool.to_owned(), u.into_owned()))
            .map_err(|e| format!("`{uri}`: the encoded URI is not UTF-8 ({e})")),
    )
}

/// A compiled RFC 6570 URI template, matched against concrete URIs.
#[derive(Debug, Clone)]
pub struct Template {
    re: regex::Regex,
}

impl Template {
    /// Compile `template` (levels 1 to 4; each expression matches what its
    /// expansion can produce).
    pub fn new(template: &str) -> Result<Template, String> {
        let mut re = String::from("^");
        let mut rest = template;
        while let Some(open) = rest.find('{') {
            re.push_str(&regex::escape(&rest[..open]));
            let after = &rest[open + 1..];
            let close = after
                .find('}')
                .ok_or_else(|| format!("URI template `{template}`: unclosed `{{`"))?;
            let expr = &after[..close];
            re.push_str(match expr.chars().next() {
                Some('+') => ".*",
                Some('#') => "(?:#.*)?",
                Some('.') => r"(?:\.[^/?#]*)*",
                Some('/') => "(?:/[^/?#]*)*",
                Some(';') => "(?:;[^/?#]*)*",
                Some('?') => r"(?:\?[^#]*)?",
                Some('&') => "(?:&[^#]*)*",
                Some(_) => "[^/?#]*",
                None => return Err(format!("URI template `{template}`: empty expression")),
            });
            rest = &after[close + 1..];
        }
        if rest.contains('}') {
            return Err(format!("URI template `{template}`: stray `}}`"));
        }
        re.push_str(&regex::escape(rest));
        re.push('$');
        regex::Regex::new(&re)
            .map(|re| Template { re })
            .map_err(|e| format!("URI template `{template}`: {e}"))
    }

    /// Whether `uri` is an expansion of this template.
    pub fn matches(&self, uri: &str) -> bool {
        self.re.is_match(uri)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cordon_uris_round_trip() {
        let u = cordon_uri("everything", "demo://resource/static/document/a b.md?x=1#y");
        assert_eq!(
            u,
            "cordon://everything/demo%3A%2F%2Fresource%2Fstatic%2Fdocument%2Fa%20b.md%3Fx%3D1%23y"
        );
        assert_eq!(
            parse_cordon_uri(&u).unwrap().unwrap(),
            (
                "everything".to_owned(),
                "demo://resource/static/document/a b.md?x=1#y".to_owned()
            )
        );
        assert!(parse_cordon_uri("file:///etc/passwd").is_none());
        assert!(parse_cordon_uri("cordon://everything").unwrap().is_err());
        assert!(parse_cordon_uri("cordon://x/%FF").unwrap().is_err());
    }

    #[test]
    fn templates_match_their_expansions_only() {
        let t = Template::new("demo://resource/dynamic/text/{resourceId}").unwrap();
        assert!(t.matches("demo://resource/dynamic/text/7"));
        assert!(t.matches("demo://resource/dynamic/text/"));
        // A simple expansion never contains `/`: no other path is reached.
        assert!(!t.matches("demo://resource/dynamic/text/7/../../secret"));
        assert!(!t.matches("demo://resource/dynamic/blob/7"));
        assert!(!t.matches("xdemo://resource/dynamic/text/7"));
        // Literal characters are literal, not regex syntax.
        let t = Template::new("a.b://x/{id}").unwrap();
        assert!(!t.matches("aXb://x/1"));
        let t = Template::new("file:///data/{+path}").unwrap();
        assert!(t.matches("file:///data/a/b.txt"));
        assert!(!t.matches("file:///etc/passwd"));
        let t = Template::new("api://items{?page,size}").unwrap();
        assert!(t.matches("api://items"));
        assert!(t.matches("api://items?page=2&size=3"));
        assert!(!t.matches("api://items/other"));
        assert!(Template::new("x://{open").is_err());
        assert!(Template::new("x://{}").is_err());
        assert!(Template::new("x://a}").is_err());
    }
}
