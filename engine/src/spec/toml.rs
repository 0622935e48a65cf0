//! TOML to [`Node`] through the `toml` crate's spanned document tables.

use toml::Spanned;
use toml::de::{DeArray, DeTable, DeValue};

use crate::diagnostic::{Diagnostic, codes};
use crate::source::{SourceFile, Span};
use crate::spec::node::{Key, Node, NodeKind};
use crate::spec::yaml::{lowercase_first, widen_to_char};

pub(super) fn parse(file: &SourceFile) -> (Option<Node>, Vec<Diagnostic>) {
    match DeTable::parse(&file.text) {
        Ok(table) => {
            let span = Span::new(file.id, table.span().start, table.span().end);
            (
                Some(Node::new(span, table_kind(table.into_inner(), file))),
                Vec::new(),
            )
        }
        Err(err) => {
            let span = err.span().map_or(Span::new(file.id, 0, 0), |r| {
                Span::new(file.id, r.start, r.end)
            });
            let message = lowercase_first(err.message());
            (
                None,
                vec![Diagnostic::error(
                    codes::TOML_SYNTAX,
                    widen_to_char(span, file),
                    message,
                )],
            )
        }
    }
}

// The document is taken apart as it is converted, each value freed once its node is built, so that the
// two trees are never both whole in memory.

fn table_kind(table: DeTable<'_>, file: &SourceFile) -> NodeKind {
    NodeKind::Map(
        table
            .into_iter()
            .map(|(k, v)| {
                let key = Key {
                    name: k.get_ref().to_string(),
                    span: Span::new(file.id, k.span().start, k.span().end),
                };
                (key, convert(v, file))
            })
            .collect(),
    )
}

fn array_kind(mut array: DeArray<'_>, file: &SourceFile) -> NodeKind {
    NodeKind::Seq(
        array
            .iter_mut()
            .map(|v| {
                let taken = std::mem::replace(v, Spanned::new(0..0, DeValue::Boolean(false)));
                convert(taken, file)
            })
            .collect(),
    )
}

fn convert(value: Spanned<DeValue<'_>>, file: &SourceFile) -> Node {
    let span = Span::new(file.id, value.span().start, value.span().end);
    let kind = match value.into_inner() {
        DeValue::String(s) => NodeKind::Str(s.to_string()),
        DeValue::Integer(i) => match i64::from_str_radix(&i.as_str().replace('_', ""), i.radix()) {
            Ok(n) => NodeKind::Int(n),
            Err(_) => NodeKind::Str(i.as_str().to_owned()),
        },
        DeValue::Float(f) => match f.as_str().replace('_', "").parse::<f64>() {
            Ok(n) => NodeKind::Float(n),
            Err(_) => NodeKind::Str(f.as_str().to_owned()),
        },
        DeValue::Boolean(b) => NodeKind::Bool(b),
        // Specs have no date type: a TOML datetime is kept as its RFC 3339 text.
        DeValue::Datetime(d) => NodeKind::Str(d.to_string()),
        DeValue::Array(a) => array_kind(a, file),
        DeValue::Table(t) => table_kind(t, file),
    };
    Node::new(span, kind)
}
