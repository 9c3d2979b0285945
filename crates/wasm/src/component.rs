//! Components exporting typed functions (`module: {function: NAME}`): the
//! function's parameters as a JSON Schema (the MCP tool's input schema), a
//! call's JSON arguments lifted into component values by the parameters'
//! types, and its result written back as JSON.
//!
//! The mapping (docs/wasm.md, "Typed functions"):
//!
//! | WIT | JSON |
//! |---|---|
//! | `bool` | boolean |
//! | integers | integer within the type's range |
//! | `f32`, `f64` | number (a result that is NaN or infinite: the string `NaN`, `inf`, `-inf`) |
//! | `char`, `string` | string (one character for `char`) |
//! | `list<T>` | array |
//! | `tuple<...>` | array of that length |
//! | `record` | object with every field (an `option` field may be left out) |
//! | `variant` | `{"case": payload}`, or `"case"` for a case without one |
//! | `enum` | its case's name |
//! | `option<T>` | `null` or T |
//! | `result<T, E>` | `{"ok": T}` or `{"error": E}` |
//! | `flags` | array of the names set |
//!
//! Resources, futures and streams cannot be given from JSON: a function
//! with one among its parameters or result is refused when the tool is
//! admitted.

use serde_json::{Map, Value, json};
use wasmtime::component::Val;
use wasmtime::component::types::{ComponentFunc, ComponentItem, Type};

/// A function export of `component` by `name`, or why there is none
/// (with the functions there are).
pub fn find(
    engine: &wasmtime::Engine,
    component: &wasmtime::component::Component,
    name: &str,
) -> Result<ComponentFunc, String> {
    let ty = component.component_type();
    let mut functions = Vec::new();
    for (export, item) in ty.exports(engine) {
        if let ComponentItem::ComponentFunc(f) = item {
            if export == name {
                return Ok(f);
            }
            functions.push(export.to_string());
        }
    }
    Err(format!(
        "the component exports no function `{name}`; its functions: {}",
        if functions.is_empty() {
            "none".to_string()
        } else {
            functions.join(", ")
        }
    ))
}

/// Whether `component` exports the WASI command interface
/// (`wasi:cli/run@0.2.x`).
pub fn is_command(engine: &wasmtime::Engine, component: &wasmtime::component::Component) -> bool {
    component
        .component_type()
        .exports(engine)
        .any(|(name, _)| name.starts_with("wasi:cli/run@0.2"))
}

/// The JSON Schema of a call's arguments: an object with one property per
/// parameter, each required unless it is an `option`; nothing else.
pub fn schema(f: &ComponentFunc) -> Result<Value, String> {
    let mut props = Map::new();
    let mut required = Vec::new();
    for (name, ty) in f.params() {
        let s = type_schema(&ty).map_err(|e| format!("parameter `{name}`: {e}"))?;
        props.insert(name.to_string(), s);
        if !matches!(ty, Type::Option(_)) {
            required.push(json!(name));
        }
    }
    for ty in f.results() {
        type_schema(&ty).map_err(|e| format!("its result: {e}"))?;
    }
    Ok(json!({
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": false,
    }))
}

fn int(min: i128, max: i128) -> Value {
    json!({"type": "integer", "minimum": min, "maximum": max})
}

fn type_schema(ty: &Type) -> Result<Value, String> {
    Ok(match ty {
        Type::Bool => json!({"type": "boolean"}),
        Type::S8 => int(i8::MIN.into(), i8::MAX.into()),
        Type::U8 => int(0, u8::MAX.into()),
        Type::S16 => int(i16::MIN.into(), i16::MAX.into()),
        Type::U16 => int(0, u16::MAX.into()),
        Type::S32 => int(i32::MIN.into(), i32::MAX.into()),
        Type::U32 => int(0, u32::MAX.into()),
        Type::S64 => int(i64::MIN.into(), i64::MAX.into()),
        Type::U64 => int(0, u64::MAX.into()),
        Type::Float32 | Type::Float64 => json!({"type": "number"}),
        Type::Char => json!({"type": "string", "minLength": 1, "maxLength": 1}),
        Type::String => json!({"type": "string"}),
        Type::List(l) => json!({"type": "array", "items": type_schema(&l.ty())?}),
        Type::Tuple(t) => {
            let items = t
                .types()
                .map(|t| type_schema(&t))
                .collect::<Result<Vec<_>, _>>()?;
            let n = items.len();
            json!({"type": "array", "prefixItems": items, "minItems": n, "maxItems": n})
        }
        Type::Record(r) => {
            let mut props = Map::new();
            let mut required = Vec::new();
            for f in r.fields() {
                props.insert(
                    f.name.to_string(),
                    type_schema(&f.ty).map_err(|e| format!("field `{}`: {e}", f.name))?,
                );
                if !matches!(f.ty, Type::Option(_)) {
                    required.push(json!(f.name));
                }
            }
            json!({"type": "object", "properties": props, "required": required,
                   "additionalProperties": false})
        }
        Type::Variant(v) => {
            let mut one_of = Vec::new();
            for c in v.cases() {
                one_of.push(match &c.ty {
                    None => json!({"const": c.name}),
                    Some(t) => {
                        let s = type_schema(t).map_err(|e| format!("case `{}`: {e}", c.name))?;
                        json!({"type": "object", "properties": {c.name: s},
                               "required": [c.name], "additionalProperties": false})
                    }
                });
            }
            json!({"oneOf": one_of})
        }
        Type::Enum(e) => json!({"type": "string", "enum": e.names().collect::<Vec<_>>()}),
        Type::Option(o) => json!({"anyOf": [{"type": "null"}, type_schema(&o.ty())?]}),
        Type::Result(r) => {
            let arm = |t: Option<Type>| t.map(|t| type_schema(&t)).transpose();
            let ok = arm(r.ok())?.unwrap_or(json!({"type": "null"}));
            let err = arm(r.err())?.unwrap_or(json!({"type": "null"}));
            json!({"oneOf": [
                {"type": "object", "properties": {"ok": ok}, "required": ["ok"], "additionalProperties": false},
                {"type": "object", "properties": {"error": err}, "required": ["error"], "additionalProperties": false},
            ]})
        }
        Type::Flags(f) => json!({"type": "array", "uniqueItems": true,
                                 "items": {"type": "string", "enum": f.names().collect::<Vec<_>>()}}),
        Type::Own(_) | Type::Borrow(_) => {
            return Err("a resource handle cannot be given or returned as JSON".into());
        }
        Type::Future(_) | Type::Stream(_) | Type::ErrorContext => {
            return Err("an asynchronous value cannot be given or returned as JSON".into());
        }
    })
}

/// The arguments of a call (a JSON object on the runner's stdin) as the
/// function's parameters, in order; an error names the argument.
pub fn arguments(f: &ComponentFunc, input: &[u8]) -> Result<Vec<Val>, String> {
    let v: Value = serde_json::from_slice(input).map_err(|e| format!("not JSON: {e}"))?;
    let Value::Object(mut args) = v else {
        return Err("not a JSON object of the function's arguments".into());
    };
    let mut out = Vec::new();
    for (name, ty) in f.params() {
        let val = match args.remove(name) {
            Some(v) => lift(&ty, &v, name)?,
            None if matches!(ty, Type::Option(_)) => Val::Option(None),
            None => return Err(format!("argument `{name}` is missing")),
        };
        out.push(val);
    }
    if let Some(extra) = args.keys().next() {
        return Err(format!(
            "argument `{extra}`: the function has no such parameter"
        ));
    }
    Ok(out)
}

fn lift(ty: &Type, v: &Value, at: &str) -> Result<Val, String> {
    let bad = |want: &str| Err(format!("`{at}`: expected {want}, found {}", kind(v)));
    macro_rules! integer {
        ($variant:ident, $t:ty) => {
            match v.as_i64().map(i128::from).or(v.as_u64().map(i128::from)) {
                Some(n) => match <$t>::try_from(n) {
                    Ok(n) => Val::$variant(n),
                    Err(_) => return Err(format!("`{at}`: {n} is out of range")),
                },
                None => return bad(concat!("an integer (", stringify!($t), ")")),
            }
        };
    }
    Ok(match ty {
        Type::Bool => match v {
            Value::Bool(b) => Val::Bool(*b),
            _ => return bad("a boolean"),
        },
        Type::S8 => integer!(S8, i8),
        Type::U8 => integer!(U8, u8),
        Type::S16 => integer!(S16, i16),
        Type::U16 => integer!(U16, u16),
        Type::S32 => integer!(S32, i32),
        Type::U32 => integer!(U32, u32),
        Type::S64 => integer!(S64, i64),
        Type::U64 => integer!(U64, u64),
        Type::Float32 => match v.as_f64() {
            Some(x) => Val::Float32(x as f32),
            None => return bad("a number"),
        },
        Type::Float64 => match v.as_f64() {
            Some(x) => Val::Float64(x),
            None => return bad("a number"),
        },
        Type::Char => {
            let mut chars = v.as_str().map(str::chars);
            match chars.as_mut().map(|c| (c.next(), c.next())) {
                Some((Some(c), None)) => Val::Char(c),
                _ => return bad("a string of one character"),
            }
        }
        Type::String => match v {
            Value::String(s) => Val::String(s.clone()),
            _ => return bad("a string"),
        },
        Type::List(l) => match v {
            Value::Array(a) => {
                let t = l.ty();
                Val::List(
                    a.iter()
                        .enumerate()
                        .map(|(i, v)| lift(&t, v, &format!("{at}[{i}]")))
                        .collect::<Result<_, _>>()?,
                )
            }
            _ => return bad("an array"),
        },
        Type::Tuple(t) => match v {
            Value::Array(a) if a.len() == t.types().len() => Val::Tuple(
                t.types()
                    .zip(a)
                    .enumerate()
                    .map(|(i, (t, v))| lift(&t, v, &format!("{at}[{i}]")))
                    .collect::<Result<_, _>>()?,
            ),
            _ => return bad(&format!("an array of {} items", t.types().len())),
        },
        Type::Record(r) => match v {
            Value::Object(o) => {
                let mut fields = Vec::new();
                for f in r.fields() {
                    let inner = format!("{at}.{}", f.name);
                    let val = match o.get(f.name) {
                        Some(v) => lift(&f.ty, v, &inner)?,
                        None if matches!(f.ty, Type::Option(_)) => Val::Option(None),
                        None => return Err(format!("`{inner}` is missing")),
                    };
                    fields.push((f.name.to_string(), val));
                }
                if let Some(extra) = o.keys().find(|k| !r.fields().any(|f| f.name == *k)) {
                    return Err(format!("`{at}.{extra}`: the record has no such field"));
                }
                Val::Record(fields)
            }
            _ => return bad("an object"),
        },
        Type::Variant(var) => {
            let (name, payload) = match v {
                Value::String(s) => (s.as_str(), None),
                Value::Object(o) if o.len() == 1 => match o.iter().next() {
                    Some((k, p)) => (k.as_str(), Some(p)),
                    None => return bad("a case"),
                },
                _ => return bad("a case's name, or an object of one case and its value"),
            };
            let Some(case) = var.cases().find(|c| c.name == name) else {
                return Err(format!("`{at}`: no case `{name}`"));
            };
            let inner = format!("{at}.{name}");
            let val = match (&case.ty, payload) {
                (None, None) => None,
                (Some(t), Some(p)) => Some(Box::new(lift(t, p, &inner)?)),
                (None, Some(_)) => return Err(format!("`{inner}`: the case carries no value")),
                (Some(_), None) => return Err(format!("`{inner}`: the case carries a value")),
            };
            Val::Variant(name.to_string(), val)
        }
        Type::Enum(e) => match v {
            Value::String(s) if e.names().any(|n| n == s) => Val::Enum(s.clone()),
            _ => {
                return bad(&format!(
                    "one of {}",
                    e.names().collect::<Vec<_>>().join(", ")
                ));
            }
        },
        Type::Option(o) => match v {
            Value::Null => Val::Option(None),
            v => Val::Option(Some(Box::new(lift(&o.ty(), v, at)?))),
        },
        Type::Result(r) => {
            let (ok, p) = match v {
                Value::Object(o) if o.len() == 1 => match (o.get("ok"), o.get("error")) {
                    (Some(p), None) => (true, p),
                    (None, Some(p)) => (false, p),
                    _ => return bad("{\"ok\": ...} or {\"error\": ...}"),
                },
                _ => return bad("{\"ok\": ...} or {\"error\": ...}"),
            };
            let t = if ok { r.ok() } else { r.err() };
            let inner = format!("{at}.{}", if ok { "ok" } else { "error" });
            let val = match (t, p) {
                (None, Value::Null) => None,
                (None, _) => return Err(format!("`{inner}`: expected null")),
                (Some(t), p) => Some(Box::new(lift(&t, p, &inner)?)),
            };
            Val::Result(if ok { Ok(val) } else { Err(val) })
        }
        Type::Flags(f) => match v {
            Value::Array(a) => {
                let mut set = Vec::new();
                for x in a {
                    match x.as_str() {
                        Some(n) if f.names().any(|m| m == n) => set.push(n.to_string()),
                        _ => return Err(format!("`{at}`: not a flag: {x}")),
                    }
                }
                Val::Flags(set)
            }
            _ => return bad("an array of flag names"),
        },
        Type::Own(_) | Type::Borrow(_) | Type::Future(_) | Type::Stream(_) | Type::ErrorContext => {
            return Err(format!("`{at}`: cannot be given as JSON"));
        }
    })
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn float(x: f64) -> Value {
    if x.is_nan() {
        json!("NaN")
    } else if x.is_infinite() {
        json!(if x > 0.0 { "inf" } else { "-inf" })
    } else {
        json!(x)
    }
}

/// A result as JSON (see the table above).
pub fn to_json(v: &Val) -> Value {
    let boxed = |b: &Option<Box<Val>>| b.as_deref().map(to_json).unwrap_or(Value::Null);
    match v {
        Val::Bool(b) => json!(b),
        Val::S8(n) => json!(n),
        Val::U8(n) => json!(n),
        Val::S16(n) => json!(n),
        Val::U16(n) => json!(n),
        Val::S32(n) => json!(n),
        Val::U32(n) => json!(n),
        Val::S64(n) => json!(n),
        Val::U64(n) => json!(n),
        Val::Float32(x) => float(f64::from(*x)),
        Val::Float64(x) => float(*x),
        Val::Char(c) => json!(c.to_string()),
        Val::String(s) => json!(s),
        Val::List(l) | Val::Tuple(l) => Value::Array(l.iter().map(to_json).collect()),
        Val::Record(fields) => Value::Object(
            fields
                .iter()
                .map(|(k, v)| (k.clone(), to_json(v)))
                .collect(),
        ),
        Val::Variant(name, None) | Val::Enum(name) => json!(name),
        Val::Variant(name, Some(p)) => json!({name: to_json(p)}),
        Val::Option(o) => boxed(o),
        Val::Result(Ok(p)) => json!({"ok": boxed(p)}),
        Val::Result(Err(p)) => json!({"error": boxed(p)}),
        Val::Flags(f) => json!(f),
        Val::Resource(_) | Val::Future(_) | Val::Stream(_) | Val::ErrorContext(_) => Value::Null,
    }
}

/// What a call writes on stdout and its exit code: the result as JSON,
/// and 0; a top-level `result` that is an error: the error's value and 1.
pub fn output(results: &[Val]) -> (Vec<u8>, i32) {
    let (value, code) = match results {
        [] => (Value::Null, 0),
        [Val::Result(Ok(p))] => (p.as_deref().map(to_json).unwrap_or(Value::Null), 0),
        [Val::Result(Err(p))] => (p.as_deref().map(to_json).unwrap_or(Value::Null), 1),
        [one] => (to_json(one), 0),
        many => (Value::Array(many.iter().map(to_json).collect()), 0),
    };
    let mut bytes = serde_json::to_vec(&value).unwrap_or_default();
    bytes.push(b'\n');
    (bytes, code)
}

/// A component that imports any `wasi:sockets` interface is refused: a
/// wasm tool has no network, and a component is linked with nothing it
/// could reach one by (the check is by name, before anything is linked).
pub fn refuse_sockets(
    engine: &wasmtime::Engine,
    component: &wasmtime::component::Component,
) -> Result<(), String> {
    let sockets: Vec<String> = component
        .component_type()
        .imports(engine)
        .map(|(name, _)| name)
        .filter(|name| name.starts_with("wasi:sockets/"))
        .map(str::to_string)
        .collect();
    if sockets.is_empty() {
        return Ok(());
    }
    Err(format!(
        "the component imports {}: a wasm tool has no network, and no socket interface is given to a component; refusing it",
        sockets.join(", ")
    ))
}
