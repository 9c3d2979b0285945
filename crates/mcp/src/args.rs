//! Tool arguments: checked against the tool's `input_schema` before anything
//! runs, then mapped onto the tool's stdin and argv as the manifest's `input`
//! declares. Nothing here goes near a shell: each argv value is one slot.

use base64::Engine as _;
use cordon_policy::policy::{Encoding, ToolPolicy};
use serde_json::{Map, Value};

/// The longest error text taken from the schema validator (it may quote the
/// caller's own value).
const MAX_DETAIL: usize = 200;

/// Why arguments were refused before the tool ran.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgError {
    /// The arguments do not match `input_schema`.
    #[error(
        "{tool}: arguments refused by input_schema at {path}: {detail} (keyword `{keyword}`){}",
        if *more > 0 { format!("; {more} more violation(s)") } else { String::new() }
    )]
    Schema {
        tool: String,
        /// JSON pointer to the failing argument, `/` for the whole object.
        path: String,
        keyword: String,
        detail: String,
        more: usize,
    },
    /// The stdin argument is not a string.
    #[error("{tool}: arguments refused: `{arg}` goes on stdin and must be a string, not {found}")]
    StdinNotString {
        tool: String,
        arg: String,
        found: &'static str,
    },
    /// The stdin argument is declared base64 but is not.
    #[error("{tool}: arguments refused: `{arg}` must be base64 ({reason})")]
    Base64 {
        tool: String,
        arg: String,
        reason: String,
    },
    /// An argv argument that is an object, array or null.
    #[error(
        "{tool}: arguments refused: `{arg}` fills an argv slot and must be a string, number or boolean, not {found}"
    )]
    ArgvType {
        tool: String,
        arg: String,
        found: &'static str,
    },
    /// An argv string that would be read as an option of the tool.
    #[error(
        "{tool}: arguments refused: `{arg}` begins with `-` and would be read as an option of the tool"
    )]
    ArgvOption { tool: String, arg: String },
    /// An argv string with a NUL byte (it cannot be passed to exec).
    #[error("{tool}: arguments refused: `{arg}` contains a NUL byte")]
    ArgvNul { tool: String, arg: String },
}

/// What a call puts on the tool's stdin and appends to its argv.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Prepared {
    pub stdin: Vec<u8>,
    pub argv: Vec<String>,
}

/// The compiled argument check of one command tool.
pub struct ArgMapper {
    tool: String,
    validator: Option<jsonschema::Validator>,
    input: cordon_policy::policy::Input,
}

impl std::fmt::Debug for ArgMapper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArgMapper")
            .field("tool", &self.tool)
            .field("schema", &self.validator.is_some())
            .field("input", &self.input)
            .finish()
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn cap(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// The schema a tool advertises: its `input_schema` when that is an object,
/// else `{"type": "object"}`.
pub fn advertised_schema(policy: &ToolPolicy) -> Map<String, Value> {
    match &policy.input_schema {
        Some(Value::Object(m)) => m.clone(),
        _ => {
            let mut m = Map::new();
            m.insert("type".into(), Value::String("object".into()));
            m
        }
    }
}

impl ArgMapper {
    /// Compile the tool's input schema. A schema that does not compile is an
    /// error naming the tool: the tool is not served rather than served
    /// unchecked.
    pub fn new(policy: &ToolPolicy) -> Result<ArgMapper, String> {
        let schema = Value::Object(advertised_schema(policy));
        let validator = jsonschema::options()
            .with_pattern_options(jsonschema::PatternOptions::regex())
            .build(&schema)
            .map_err(|e| {
                format!(
                    "{}: input_schema does not compile: {}",
                    policy.name,
                    cap(&e.to_string(), MAX_DETAIL)
                )
            })?;
        Ok(ArgMapper {
            tool: policy.name.clone(),
            validator: Some(validator),
            input: policy.input.clone(),
        })
    }

    /// Check `args` against the schema and map them. `None` (no arguments)
    /// is checked as `{}`.
    pub fn prepare(&self, args: Option<&Map<String, Value>>) -> Result<Prepared, ArgError> {
        let empty = Map::new();
        let args = args.unwrap_or(&empty);
        let instance = Value::Object(args.clone());
        if let Some(v) = &self.validator {
            let mut errors = v.iter_errors(&instance);
            if let Some(first) = errors.next() {
                let path = first.instance_path().as_str().to_owned();
                return Err(ArgError::Schema {
                    tool: self.tool.clone(),
                    path: if path.is_empty() {
                        "/".into()
                    } else {
                        cap(&path, MAX_DETAIL)
                    },
                    keyword: first.kind().keyword().to_owned(),
                    detail: cap(&first.to_string(), MAX_DETAIL),
                    more: errors.count(),
                });
            }
        }
        let mut out = Prepared::default();
        if self.input.json {
            // A typed function's arguments: the whole object, which its
            // runner lifts into the parameters' types (checked again there).
            out.stdin = serde_json::to_vec(args).unwrap_or_default();
        }
        if let Some(name) = &self.input.stdin
            && let Some(v) = args.get(name)
        {
            let Value::String(s) = v else {
                return Err(ArgError::StdinNotString {
                    tool: self.tool.clone(),
                    arg: name.clone(),
                    found: type_name(v),
                });
            };
            out.stdin = match self.input.encoding {
                Encoding::Text => s.as_bytes().to_vec(),
                Encoding::Base64 => decode_base64(s).map_err(|reason| ArgError::Base64 {
                    tool: self.tool.clone(),
                    arg: name.clone(),
                    reason,
                })?,
            };
        }
        for name in &self.input.argv {
            let Some(v) = args.get(name) else {
                // An optional argument that was not given fills no slot.
                continue;
            };
            let slot = match v {
                Value::String(s) => {
                    if s.starts_with('-') {
                        return Err(ArgError::ArgvOption {
                            tool: self.tool.clone(),
                            arg: name.clone(),
                        });
                    }
                    s.clone()
                }
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                other => {
                    return Err(ArgError::ArgvType {
                        tool: self.tool.clone(),
                        arg: name.clone(),
                        found: type_name(other),
                    });
                }
            };
            if slot.contains('\0') {
                return Err(ArgError::ArgvNul {
                    tool: self.tool.clone(),
                    arg: name.clone(),
                });
            }
            out.argv.push(slot);
        }
        Ok(out)
    }
}

/// Standard or URL-safe base64, padded or not, with whitespace (line
/// breaks of MIME-style encoders) ignored.
fn decode_base64(s: &str) -> Result<Vec<u8>, String> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    let compact: String = s.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    let mut first_err = None;
    for engine in [&STANDARD, &STANDARD_NO_PAD, &URL_SAFE, &URL_SAFE_NO_PAD] {
        match engine.decode(compact.as_bytes()) {
            Ok(b) => return Ok(b),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    Err(first_err.map(|e| e.to_string()).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy(yaml_tool: &str) -> ToolPolicy {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("cordon.yaml");
        std::fs::write(&p, format!("version: 1\ntools:\n  t:\n{yaml_tool}")).unwrap();
        let loaded = cordon_policy::load(&p).unwrap();
        loaded.policy.get("t").unwrap().clone()
    }

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    const WC: &str = "    profile: P1\n    command: [\"/usr/bin/wc\"]\n    network: none\n    input: {stdin: text}\n    input_schema:\n      type: object\n      properties: {text: {type: string}}\n      required: [text]\n";

    #[test]
    fn text_goes_on_stdin() {
        let m = ArgMapper::new(&policy(WC)).unwrap();
        let p = m.prepare(Some(&obj(json!({"text": "a b"})))).unwrap();
        assert_eq!(p.stdin, b"a b");
        assert!(p.argv.is_empty());
    }

    #[test]
    fn a_missing_required_argument_names_the_root_and_the_keyword() {
        let m = ArgMapper::new(&policy(WC)).unwrap();
        let e = m.prepare(None).unwrap_err();
        match &e {
            ArgError::Schema { path, keyword, .. } => {
                assert_eq!(path, "/");
                assert_eq!(keyword, "required");
            }
            other => panic!("{other:?}"),
        }
        assert!(
            e.to_string().contains("\"text\" is a required property"),
            "{e}"
        );
    }

    #[test]
    fn a_wrong_type_names_the_failing_path() {
        let m = ArgMapper::new(&policy(WC)).unwrap();
        let e = m.prepare(Some(&obj(json!({"text": 42})))).unwrap_err();
        assert!(
            matches!(&e, ArgError::Schema { path, keyword, .. } if path == "/text" && keyword == "type"),
            "{e:?}"
        );
    }

    const B64: &str = "    profile: P1\n    command: [\"/usr/bin/cat\"]\n    network: none\n    input: {stdin: data, encoding: base64}\n    input_schema:\n      type: object\n      properties: {data: {type: string}}\n";

    #[test]
    fn base64_is_decoded_and_bad_base64_refused() {
        let m = ArgMapper::new(&policy(B64)).unwrap();
        let p = m
            .prepare(Some(&obj(json!({"data": "AAEC/w==\n"}))))
            .unwrap();
        assert_eq!(p.stdin, vec![0, 1, 2, 255]);
        let e = m.prepare(Some(&obj(json!({"data": "!!!"})))).unwrap_err();
        assert!(matches!(e, ArgError::Base64 { .. }), "{e:?}");
        // No stdin argument given: empty stdin.
        assert!(m.prepare(None).unwrap().stdin.is_empty());
    }

    const ARGV: &str = "    profile: P1\n    command: [\"/usr/bin/echo\"]\n    network: none\n    input: {argv: [a, b, c]}\n    input_schema:\n      type: object\n      properties: {a: {}, b: {}, c: {}}\n";

    #[test]
    fn argv_slots_take_scalars_in_declared_order() {
        let m = ArgMapper::new(&policy(ARGV)).unwrap();
        let p = m
            .prepare(Some(&obj(json!({"c": true, "a": "x y; rm -rf /", "b": 3}))))
            .unwrap();
        assert_eq!(p.argv, vec!["x y; rm -rf /", "3", "true"]);
        let p = m.prepare(Some(&obj(json!({"b": -1.5})))).unwrap();
        assert_eq!(p.argv, vec!["-1.5"]);
    }

    #[test]
    fn argv_refuses_structures_options_and_nul() {
        let m = ArgMapper::new(&policy(ARGV)).unwrap();
        for (v, want) in [
            (json!({"a": [1]}), "an array"),
            (json!({"a": {"k": 1}}), "an object"),
            (json!({"a": null}), "null"),
        ] {
            match m.prepare(Some(&obj(v))).unwrap_err() {
                ArgError::ArgvType { found, arg, .. } => {
                    assert_eq!(found, want);
                    assert_eq!(arg, "a");
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(matches!(
            m.prepare(Some(&obj(json!({"b": "--files0-from=/etc/shadow"})))),
            Err(ArgError::ArgvOption { .. })
        ));
        assert!(matches!(
            m.prepare(Some(&obj(json!({"b": "a\u{0}b"})))),
            Err(ArgError::ArgvNul { .. })
        ));
    }

    #[test]
    fn a_tool_without_schema_takes_an_object() {
        let m = ArgMapper::new(&policy(
            "    profile: P1\n    command: [\"/usr/bin/true\"]\n    network: none\n",
        ))
        .unwrap();
        assert_eq!(m.prepare(None).unwrap(), Prepared::default());
        assert!(matches!(
            m.prepare(Some(&obj(json!({"x": 1})))),
            Ok(Prepared { .. })
        ));
    }
}
