//! Diagnostics as plain data: severity, stable code, message, spans and hints. Rendering is the CLI's job.

use crate::source::Span;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    Error,
    Warning,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        }
    }
}

/// A secondary location with a short explanation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Label {
    pub span: Span,
    pub message: String,
}

/// One problem found in a spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    pub severity: Severity,
    /// Stable identifier such as `archon::unknown_step`; documented in `docs/diagnostics.md`.
    pub code: &'static str,
    pub message: String,
    pub span: Span,
    pub labels: Vec<Label>,
    pub hints: Vec<String>,
}

impl Diagnostic {
    pub fn error(code: &'static str, span: Span, message: impl Into<String>) -> Self {
        Diagnostic {
            severity: Severity::Error,
            code,
            message: message.into(),
            span,
            labels: Vec::new(),
            hints: Vec::new(),
        }
    }

    pub fn warning(code: &'static str, span: Span, message: impl Into<String>) -> Self {
        Diagnostic {
            severity: Severity::Warning,
            ..Diagnostic::error(code, span, message)
        }
    }

    pub fn with_label(mut self, span: Span, message: impl Into<String>) -> Self {
        self.labels.push(Label {
            span,
            message: message.into(),
        });
        self
    }

    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hints.push(hint.into());
        self
    }

    /// Adds a hint only when there is one (for "did you mean" suggestions).
    pub fn with_hint_opt(self, hint: Option<String>) -> Self {
        match hint {
            Some(h) => self.with_hint(h),
            None => self,
        }
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

/// The problems one pass over a file keeps: at most [`Bounded::MOST`], then only how many more there were,
/// so that a file of 200,000 unknown keys costs the memory of a thousand diagnostics, not of 200,000.
#[derive(Debug, Default)]
pub(crate) struct Bounded {
    list: Vec<Diagnostic>,
    omitted: usize,
    first_omitted: Option<Span>,
}

impl Bounded {
    /// Problems kept from one pass over a file.
    pub(crate) const MOST: usize = 1_000;

    pub(crate) fn push(&mut self, diagnostic: Diagnostic) {
        if self.list.len() < Self::MOST {
            self.list.push(diagnostic);
        } else {
            self.omitted += 1;
            self.first_omitted.get_or_insert(diagnostic.span);
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The problems kept, and then, if any were not, one that says how many.
    pub(crate) fn into_vec(mut self) -> Vec<Diagnostic> {
        if let Some(at) = self.first_omitted {
            self.list.push(
                Diagnostic::error(
                    codes::TOO_MANY_PROBLEMS,
                    at,
                    format!(
                        "{} more problems like those above are not shown",
                        self.omitted
                    ),
                )
                .with_hint("fix the problems shown and validate again"),
            );
        }
        self.list
    }
}

/// Every diagnostic code the validator emits, one per line of `docs/diagnostics.md`.
pub mod codes {
    pub const YAML_SYNTAX: &str = "archon::yaml_syntax";
    pub const TOML_SYNTAX: &str = "archon::toml_syntax";
    pub const FILE_TOO_LARGE: &str = "archon::file_too_large";
    pub const TOO_MANY_PROBLEMS: &str = "archon::too_many_problems";
    pub const NESTING_TOO_DEEP: &str = "archon::nesting_too_deep";
    pub const ALIAS_BUDGET: &str = "archon::alias_budget";
    pub const TOO_MANY_STEPS: &str = "archon::too_many_steps";
    pub const UNREADABLE_FILE: &str = "archon::unreadable_file";
    pub const UNKNOWN_KEY: &str = "archon::unknown_key";
    pub const WRONG_TYPE: &str = "archon::wrong_type";
    pub const INVALID_VALUE: &str = "archon::invalid_value";
    pub const MISSING_KEY: &str = "archon::missing_key";
    pub const DUPLICATE_KEY: &str = "archon::duplicate_key";
    pub const INVALID_NAME: &str = "archon::invalid_name";
    pub const INVALID_LABEL: &str = "archon::invalid_label";
    pub const DUPLICATE_STEP: &str = "archon::duplicate_step";
    pub const UNKNOWN_STEP: &str = "archon::unknown_step";
    pub const CYCLE: &str = "archon::cycle";
    pub const UNKNOWN_TOOL: &str = "archon::unknown_tool";
    pub const UNKNOWN_PROVIDER: &str = "archon::unknown_provider";
    pub const UNKNOWN_PROVIDER_KIND: &str = "archon::unknown_provider_kind";
    pub const UNKNOWN_AGENT: &str = "archon::unknown_agent";
    pub const MISSING_STEP_KIND: &str = "archon::missing_step_kind";
    pub const CONFLICTING_STEP_KINDS: &str = "archon::conflicting_step_kinds";
    pub const CONFLICTING_LOOPS: &str = "archon::conflicting_loops";
    pub const MISSING_TOOL_KIND: &str = "archon::missing_tool_kind";
    pub const CONFLICTING_TOOL_KINDS: &str = "archon::conflicting_tool_kinds";
    pub const SHADOWED_BUILTIN: &str = "archon::shadowed_builtin";
    pub const TEMPLATE_SYNTAX: &str = "archon::template_syntax";
    pub const EXPRESSION_SYNTAX: &str = "archon::expression_syntax";
    pub const UNKNOWN_INPUT: &str = "archon::unknown_input";
    pub const UNKNOWN_OUTPUT: &str = "archon::unknown_output";
    pub const UNKNOWN_STEP_FIELD: &str = "archon::unknown_step_field";
    pub const UNKNOWN_VARIABLE: &str = "archon::unknown_variable";
    pub const UNKNOWN_FILTER: &str = "archon::unknown_filter";
    pub const UNKNOWN_SECRET: &str = "archon::unknown_secret";
    pub const SECRET_IN_PROMPT: &str = "archon::secret_in_prompt";
    pub const ITEM_OUTSIDE_FOREACH: &str = "archon::item_outside_foreach";
    pub const DYNAMIC_STEP_REFERENCE: &str = "archon::dynamic_step_reference";
    pub const UNKNOWN_PARAMETER: &str = "archon::unknown_parameter";
    pub const UNKNOWN_ARGUMENT: &str = "archon::unknown_argument";
    pub const MISSING_ARGUMENT: &str = "archon::missing_argument";
    pub const INVALID_JSON_SCHEMA: &str = "archon::invalid_json_schema";
    pub const INVALID_DEFAULT: &str = "archon::invalid_default";
    pub const INVALID_DURATION: &str = "archon::invalid_duration";
    pub const UNKNOWN_TRIGGER: &str = "archon::unknown_trigger";
    pub const UNKNOWN_ACTION: &str = "archon::unknown_action";
    pub const INVALID_GLOB: &str = "archon::invalid_glob";
    pub const PATTERN_MATCHES_NOTHING: &str = "archon::pattern_matches_nothing";
    pub const RECURSIVE_TOOL: &str = "archon::recursive_tool";
    pub const RECURSIVE_WORKFLOW: &str = "archon::recursive_workflow";
    pub const FILE_NOT_FOUND: &str = "archon::file_not_found";
    pub const INVALID_ARGUMENT: &str = "archon::invalid_argument";
    pub const INVALID_SUBWORKFLOW: &str = "archon::invalid_subworkflow";
    pub const MISSING_INPUT: &str = "archon::missing_input";
    pub const INEFFECTIVE_FIELD: &str = "archon::ineffective_field";
    pub const DOLLAR_TEMPLATE: &str = "archon::dollar_template";
    pub const SHELL_TEMPLATE: &str = "archon::shell_template";
    pub const TOML_TABLE_SCOPE: &str = "archon::toml_table_scope";
    pub const EMPTY_WORKFLOW: &str = "archon::empty_workflow";
    pub const PLAN_NOT_ALLOWED: &str = "archon::plan_not_allowed";
    pub const CACHE_WITH_APPROVAL: &str = "archon::cache_with_approval";
    pub const CACHE_SENSITIVE: &str = "archon::cache_sensitive";
    pub const CACHE_UNSUPPORTED: &str = "archon::cache_unsupported";
    pub const INVALID_MCP_FILE: &str = "archon::invalid_mcp_file";
    pub const UNKNOWN_MCP_SERVER: &str = "archon::unknown_mcp_server";
    pub const MCP_NOT_LISTED: &str = "archon::mcp_not_listed";
    pub const SKILL_FRONT_MATTER: &str = "archon::skill_front_matter";
    pub const SKILL_NAME: &str = "archon::skill_name";
    pub const SKILL_DESCRIPTION: &str = "archon::skill_description";
    pub const SKILL_RULES: &str = "archon::skill_rules";
    pub const SKILL_CATALOG_OVER_BUDGET: &str = "archon::skill_catalog_over_budget";
    pub const INVALID_CONFIG: &str = "archon::invalid_config";
    pub const INVALID_CRON: &str = "archon::invalid_cron";
    pub const UNKNOWN_TIMEZONE: &str = "archon::unknown_timezone";
    pub const INVALID_INPUT: &str = "archon::invalid_input";
    pub const DUPLICATE_TRIGGER: &str = "archon::duplicate_trigger";
}
