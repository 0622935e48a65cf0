//! Keeping secret values out of everything a run writes down: the run store, events and the report.
//!
//! Values of the secrets a run reads are replaced by `***` wherever they appear in text: step outputs,
//! errors, event messages, workflow outputs. Templates still see the real values while the run goes on;
//! only what leaves the run is redacted (so a resumed run reuses the redacted form). Values shorter than
//! four characters are not searched for, since they would match ordinary text.

use std::borrow::Cow;

use serde_json::{Map, Value as Json};

use super::{RunEvent, StepResult};

/// What secret values are replaced with.
pub const MASK: &str = "***";
const MIN_LEN: usize = 4;

/// The secret values to keep out of what a run writes.
#[derive(Clone, Debug, Default)]
pub struct Redactor {
    /// Longest first, so that a secret containing another is masked whole.
    values: Vec<String>,
}

impl Redactor {
    pub fn new(values: impl IntoIterator<Item = String>) -> Self {
        let mut values: Vec<String> = values.into_iter().filter(|v| v.len() >= MIN_LEN).collect();
        values.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        values.dedup();
        Redactor { values }
    }

    /// This redactor's values and `other`'s.
    pub fn with(&self, other: &Redactor) -> Redactor {
        Redactor::new(self.values.iter().chain(&other.values).cloned())
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    pub fn text<'a>(&self, text: &'a str) -> Cow<'a, str> {
        if !self.values.iter().any(|v| text.contains(v.as_str())) {
            return Cow::Borrowed(text);
        }
        let mut out = text.to_owned();
        for value in &self.values {
            if out.contains(value.as_str()) {
                out = out.replace(value.as_str(), MASK);
            }
        }
        Cow::Owned(out)
    }

    fn string(&self, text: &mut String) {
        if let Cow::Owned(redacted) = self.text(text) {
            *text = redacted;
        }
    }

    pub fn json(&self, value: &mut Json) {
        if self.is_empty() {
            return;
        }
        match value {
            Json::String(text) => self.string(text),
            Json::Array(items) => items.iter_mut().for_each(|i| self.json(i)),
            Json::Object(map) => self.map(map),
            _ => {}
        }
    }

    pub fn map(&self, map: &mut Map<String, Json>) {
        if self.is_empty() {
            return;
        }
        // Keys are data too (`echo` returns its arguments).
        let keys: Vec<String> = map
            .keys()
            .filter(|k| matches!(self.text(k), Cow::Owned(_)))
            .cloned()
            .collect();
        for key in keys {
            if let Some(value) = map.remove(&key) {
                map.insert(self.text(&key).into_owned(), value);
            }
        }
        map.values_mut().for_each(|v| self.json(v));
    }

    pub fn option(&self, text: &mut Option<String>) {
        if let Some(text) = text {
            self.string(text);
        }
    }

    pub fn result(&self, result: &mut StepResult) {
        if self.is_empty() {
            return;
        }
        self.json(&mut result.output);
        self.string(&mut result.text);
        self.map(&mut result.outputs);
        self.option(&mut result.error);
        result.steps.values_mut().for_each(|r| self.result(r));
        if let Some(plan) = &mut result.plan {
            self.json(plan);
        }
    }

    pub fn event(&self, event: &mut RunEvent) {
        if self.is_empty() {
            return;
        }
        match event {
            RunEvent::StepRetried { error, .. } => self.string(error),
            RunEvent::StepFinished { error, .. } => self.option(error),
            RunEvent::StepSkipped { reason, .. } => self.string(reason),
            RunEvent::AgentThought { text, .. } | RunEvent::AgentAnswer { text, .. } => {
                self.string(text);
            }
            RunEvent::AgentObservation {
                text, full_text, ..
            } => {
                self.string(text);
                self.option(full_text);
            }
            RunEvent::AgentAction { arguments, .. }
            | RunEvent::ApprovalRequested { arguments, .. } => self.json(arguments),
            RunEvent::ApprovalDecided { reason, .. } => self.option(reason),
            RunEvent::PlanProposed { text, .. } => self.string(text),
            RunEvent::PlanRejected { problems, .. } => {
                problems.iter_mut().for_each(|p| self.string(p))
            }
            RunEvent::PlanRevising { reason, .. } => self.string(reason),
            RunEvent::StepStarted { .. }
            | RunEvent::PlanAccepted { .. }
            | RunEvent::Resumed { .. }
            | RunEvent::RuleMatched { .. }
            | RunEvent::StepReused { .. }
            | RunEvent::LlmCall { .. }
            | RunEvent::AgentCompacted { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_masked_in_text_and_json_keys_and_values() {
        let redactor = Redactor::new([
            "s3cr3t-token".to_owned(),
            "s3cr3t".to_owned(),
            "ab".to_owned(),
        ]);
        assert_eq!(
            redactor.text("a s3cr3t-token and s3cr3t, ab"),
            "a *** and ***, ab"
        );
        let mut value = serde_json::json!({ "s3cr3t": ["x s3cr3t-token"], "n": 1 });
        redactor.json(&mut value);
        assert_eq!(value, serde_json::json!({ "***": ["x ***"], "n": 1 }));
        assert!(matches!(redactor.text("nothing here"), Cow::Borrowed(_)));
    }
}
