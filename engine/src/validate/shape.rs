//! The workflow JSON Schema compiled, once per process, into shapes the structural check can walk
//! without looking keywords up in JSON objects at every node.

use std::collections::HashMap;
use std::sync::OnceLock;

use serde_json::Value as Json;

use crate::spec::schema::workflow_schema;

pub type ShapeId = usize;

/// What a schema (or sub-schema) admits.
#[derive(Debug)]
pub enum Shape {
    /// Anything (`true` or `{}`).
    Any,
    /// Nothing (`false`).
    Never,
    /// A named definition (`$ref`); its name words messages and picks diagnostic codes.
    Named {
        def: String,
        inner: ShapeId,
    },
    /// One of these values (`enum`, `const`, or a union of them).
    Enum(Vec<Json>),
    /// The first branch whose types accept the value (`anyOf` / `oneOf`).
    Union(Vec<ShapeId>),
    Typed(Typed),
}

#[derive(Debug, Default)]
pub struct Typed {
    /// JSON type names; empty means any type.
    pub types: Vec<&'static str>,
    pub properties: Vec<(String, ShapeId)>,
    pub additional: Additional,
    pub required: Vec<String>,
    pub items: Option<ShapeId>,
    pub min: i64,
    pub max: i64,
}

#[derive(Debug, Default, Clone, Copy)]
pub enum Additional {
    #[default]
    Allowed,
    Denied,
    Schema(ShapeId),
}

/// All shapes of the workflow schema, with each shape's admitted types and enumeration precomputed.
#[derive(Debug)]
pub struct Shapes {
    pub nodes: Vec<Shape>,
    /// For each shape, the JSON types it admits (empty: any).
    pub types: Vec<Vec<&'static str>>,
    /// For each shape, its allowed values when it is an enumeration.
    pub enums: Vec<Option<Vec<Json>>>,
    pub root: ShapeId,
}

impl Shapes {
    /// The compiled workflow schema.
    pub fn workflow() -> &'static Shapes {
        static SHAPES: OnceLock<Shapes> = OnceLock::new();
        SHAPES.get_or_init(|| Compiler::default().finish(workflow_schema()))
    }
}

#[derive(Default)]
struct Compiler<'a> {
    nodes: Vec<Shape>,
    defs: HashMap<&'a str, ShapeId>,
}

impl<'a> Compiler<'a> {
    fn finish(mut self, schema: &'a Json) -> Shapes {
        let root = self.compile(schema, schema);
        let mut types = vec![None; self.nodes.len()];
        let mut enums = vec![None; self.nodes.len()];
        for id in 0..self.nodes.len() {
            types[id] = Some(types_of(&self.nodes, id));
            enums[id] = Some(enum_of(&self.nodes, id));
        }
        Shapes {
            nodes: self.nodes,
            types: types.into_iter().map(Option::unwrap_or_default).collect(),
            enums: enums.into_iter().map(Option::flatten).collect(),
            root,
        }
    }

    fn push(&mut self, shape: Shape) -> ShapeId {
        self.nodes.push(shape);
        self.nodes.len() - 1
    }

    fn compile(&mut self, schema: &'a Json, root: &'a Json) -> ShapeId {
        let object = match schema {
            Json::Bool(true) => return self.push(Shape::Any),
            Json::Bool(false) => return self.push(Shape::Never),
            Json::Object(o) => o,
            _ => return self.push(Shape::Any),
        };
        if let Some(name) = object
            .get("$ref")
            .and_then(Json::as_str)
            .and_then(|r| r.strip_prefix("#/$defs/"))
        {
            if let Some(&id) = self.defs.get(name) {
                return id;
            }
            let id = self.push(Shape::Named {
                def: name.to_owned(),
                inner: usize::MAX,
            });
            self.defs.insert(name, id);
            let def = root
                .get("$defs")
                .and_then(|d| d.get(name))
                .unwrap_or(&Json::Bool(true));
            let inner = self.compile(def, root);
            self.nodes[id] = Shape::Named {
                def: name.to_owned(),
                inner,
            };
            return id;
        }
        if let Some(values) = object.get("enum").and_then(Json::as_array) {
            return self.push(Shape::Enum(values.clone()));
        }
        if let Some(value) = object.get("const") {
            return self.push(Shape::Enum(vec![value.clone()]));
        }
        if let Some(branches) = object
            .get("anyOf")
            .or_else(|| object.get("oneOf"))
            .and_then(Json::as_array)
        {
            let ids = branches.iter().map(|b| self.compile(b, root)).collect();
            return self.push(Shape::Union(ids));
        }
        let types = match object.get("type") {
            Some(Json::String(t)) => vec![type_name(t)],
            Some(Json::Array(ts)) => ts.iter().filter_map(Json::as_str).map(type_name).collect(),
            _ => Vec::new(),
        };
        let properties = object
            .get("properties")
            .and_then(Json::as_object)
            .map(|p| {
                p.iter()
                    .map(|(k, v)| (k.clone(), self.compile(v, root)))
                    .collect()
            })
            .unwrap_or_default();
        let additional = match object.get("additionalProperties") {
            None | Some(Json::Bool(true)) => Additional::Allowed,
            Some(Json::Bool(false)) => Additional::Denied,
            Some(s) => Additional::Schema(self.compile(s, root)),
        };
        let required = object
            .get("required")
            .and_then(Json::as_array)
            .map(|r| {
                r.iter()
                    .filter_map(Json::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        let items = object.get("items").map(|s| self.compile(s, root));
        let (format_min, format_max) = match object.get("format").and_then(Json::as_str) {
            Some("uint8") => (0, i64::from(u8::MAX)),
            Some("uint16") => (0, i64::from(u16::MAX)),
            Some("uint32") => (0, i64::from(u32::MAX)),
            Some("uint64" | "uint") => (0, i64::MAX),
            Some("int32") => (i64::from(i32::MIN), i64::from(i32::MAX)),
            _ => (i64::MIN, i64::MAX),
        };
        let min = object
            .get("minimum")
            .and_then(Json::as_i64)
            .unwrap_or(i64::MIN)
            .max(format_min);
        let max = object
            .get("maximum")
            .and_then(Json::as_i64)
            .unwrap_or(i64::MAX)
            .min(format_max);
        self.push(Shape::Typed(Typed {
            types,
            properties,
            additional,
            required,
            items,
            min,
            max,
        }))
    }
}

fn type_name(t: &str) -> &'static str {
    match t {
        "null" => "null",
        "boolean" => "boolean",
        "integer" => "integer",
        "number" => "number",
        "string" => "string",
        "array" => "array",
        "object" => "object",
        _ => "unknown",
    }
}

/// The JSON type of a value, as named in schemas.
pub fn json_type(value: &Json) -> &'static str {
    match value {
        Json::Null => "null",
        Json::Bool(_) => "boolean",
        Json::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Json::Number(_) => "number",
        Json::String(_) => "string",
        Json::Array(_) => "array",
        Json::Object(_) => "object",
    }
}

fn types_of(nodes: &[Shape], id: ShapeId) -> Vec<&'static str> {
    match &nodes[id] {
        Shape::Any | Shape::Never => Vec::new(),
        Shape::Named { inner, .. } => types_of(nodes, *inner),
        Shape::Union(branches) => branches.iter().flat_map(|b| types_of(nodes, *b)).collect(),
        Shape::Enum(values) => {
            let mut types: Vec<&str> = values.iter().map(json_type).collect();
            types.dedup();
            types
        }
        Shape::Typed(t) => t.types.clone(),
    }
}

fn enum_of(nodes: &[Shape], id: ShapeId) -> Option<Vec<Json>> {
    match &nodes[id] {
        Shape::Named { inner, .. } => enum_of(nodes, *inner),
        Shape::Enum(values) => Some(values.clone()),
        Shape::Union(branches) => {
            let mut all = Vec::new();
            for b in branches {
                all.extend(enum_of(nodes, *b)?);
            }
            Some(all)
        }
        _ => None,
    }
}
