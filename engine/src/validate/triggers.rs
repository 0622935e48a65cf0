//! `triggers:` — cron expressions and time zones, keys that belong to one kind of trigger, webhook
//! secrets and inputs, the input values a trigger gives, and trigger names.

use crate::diagnostic::{Diagnostic, codes};
use crate::source::Span;
use crate::spec::{MAX_CATCH_UP, Node, Spanned, TriggerDef, time_zones};
use crate::validate::templates::locate;
use crate::validate::{Checker, suggest};

impl Checker<'_> {
    pub(super) fn check_triggers(&mut self) {
        let triggers = &self.spec.triggers;
        // (name, where it is written or derived from), to find names given twice.
        let mut names: Vec<(String, Span)> = Vec::new();
        let mut webhook: Option<Span> = None;
        for trigger in triggers {
            let anchor = trigger_anchor(trigger);
            let def = &trigger.value;
            match (&def.cron, &def.webhook) {
                (None, None) => self.push(
                    Diagnostic::error(
                        codes::MISSING_KEY,
                        anchor,
                        "a trigger needs `cron` (a schedule) or `webhook`",
                    )
                    .with_hint(self.syntax(
                        "for example `- cron: \"0 9 * * MON-FRI\"` or `- webhook: { secret: HOOK_SECRET }`",
                        "for example `cron = \"0 9 * * MON-FRI\"` or `webhook = { secret = \"HOOK_SECRET\" }` under `[[triggers]]`",
                    )),
                ),
                (Some(cron), Some(hook)) => self.push(
                    Diagnostic::error(
                        codes::INVALID_VALUE,
                        hook.span,
                        "a trigger is either `cron` or `webhook`, not both",
                    )
                    .with_label(cron.span, "`cron` given here")
                    .with_hint("write them as two triggers"),
                ),
                _ => {}
            }
            if let Some(cron) = &def.cron {
                self.check_cron(cron);
            }
            if let Some(zone) = &def.timezone {
                self.check_time_zone(zone);
            }
            if let Some(catch_up) = &def.catch_up
                && self.check_duration(catch_up)
                && let Some(window) = catch_up.value.get()
                && (window.is_zero() || window > MAX_CATCH_UP)
            {
                self.push(
                    Diagnostic::error(
                        codes::INVALID_VALUE,
                        catch_up.span,
                        format!(
                            "`catch_up` must be more than 0 and at most 7d, not `{}`",
                            catch_up.value.text
                        ),
                    )
                    .with_hint("leave it out to fire no missed slot when a server starts"),
                );
            }
            if def.cron.is_none() && def.webhook.is_some() {
                let only_cron = [
                    ("timezone", def.timezone.as_ref().map(|t| t.span)),
                    ("overlap", def.overlap.as_ref().map(|o| o.span)),
                    ("catch_up", def.catch_up.as_ref().map(|c| c.span)),
                ];
                for (key, span) in only_cron {
                    if let Some(span) = span {
                        self.push(
                            Diagnostic::error(
                                codes::INVALID_VALUE,
                                span,
                                format!("`{key}` applies only to a `cron` trigger"),
                            )
                            .with_hint("every delivery of a webhook starts its own run"),
                        );
                    }
                }
            }
            if let Some(hook) = &def.webhook {
                if let Some(first) = webhook {
                    self.push(
                        Diagnostic::error(
                            codes::DUPLICATE_TRIGGER,
                            hook.span,
                            "a workflow has at most one webhook",
                        )
                        .with_label(first, "the first webhook")
                        .with_hint("its deliveries all come to `POST /hooks/<workflow>`"),
                    );
                } else {
                    webhook = Some(hook.span);
                }
                self.check_webhook(def, hook.span);
            }
            if let Some(name) = &def.name {
                let valid = name
                    .value
                    .starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                    && name.value.len() <= 64
                    && name.value.chars().all(|c| {
                        c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_'
                    });
                if !valid {
                    self.push(
                        Diagnostic::error(
                            codes::INVALID_NAME,
                            name.span,
                            format!("trigger name `{}` is not a slug", name.value),
                        )
                        .with_hint(
                            "use at most 64 lowercase letters, digits, `-` and `_`, such as `nightly`",
                        ),
                    );
                }
            }
            if def.cron.is_some() || def.webhook.is_some() {
                let name = def.name();
                let at = def.name.as_ref().map_or(anchor, |n| n.span);
                match names.iter().find(|(n, _)| *n == name) {
                    Some((_, first)) => self.push(
                        Diagnostic::error(
                            codes::DUPLICATE_TRIGGER,
                            at,
                            format!("two triggers are named `{name}`"),
                        )
                        .with_label(*first, "the first")
                        .with_hint(
                            "a trigger's name keys its firings: give each trigger its own `name`",
                        ),
                    ),
                    None => names.push((name, at)),
                }
            }
            self.check_trigger_inputs(def, anchor);
        }
    }

    fn check_cron(&mut self, cron: &Spanned<crate::spec::CronText>) {
        let Some(error) = cron.value.error() else {
            return;
        };
        let at = locate(self.file, cron.span, &cron.value.text, error.range.clone());
        self.push(
            Diagnostic::error(codes::INVALID_CRON, at, error.message.clone())
                .with_hint_opt(error.hint.clone()),
        );
    }

    fn check_time_zone(&mut self, zone: &Spanned<crate::spec::TimeZoneText>) {
        if zone.value.get().is_some() {
            return;
        }
        let names: Vec<String> = time_zones()
            .available()
            .map(|n| n.as_str().to_owned())
            .collect();
        let name = zone.value.text.trim();
        self.push(
            Diagnostic::error(
                codes::UNKNOWN_TIMEZONE,
                zone.span,
                format!("unknown time zone `{name}`"),
            )
            .with_hint_opt(suggest::did_you_mean(
                name,
                names.iter().map(String::as_str),
            ))
            .with_hint(
                "write an IANA time zone name, such as `Europe/Paris`, `America/New_York` or `UTC`",
            ),
        );
    }

    fn check_webhook(&mut self, def: &TriggerDef, at: Span) {
        let Some(hook) = &def.webhook else { return };
        if hook.secret.is_none() && hook.token.is_none() {
            self.push(
                Diagnostic::error(
                    codes::MISSING_KEY,
                    at,
                    "a webhook needs `secret` (an HMAC signature of the body) or `token` (a bearer token)",
                )
                .with_hint("anyone who can reach the server could start the workflow otherwise; name a secret of `secrets`"),
            );
        }
        let declared: Vec<&str> = self.spec.secrets.iter().map(|s| s.value.as_str()).collect();
        for name in [&hook.secret, &hook.token].into_iter().flatten() {
            if !declared.contains(&name.value.as_str()) {
                self.push(
                    Diagnostic::error(
                        codes::UNKNOWN_SECRET,
                        name.span,
                        format!("unknown secret `{}`", name.value),
                    )
                    .with_hint_opt(suggest::did_you_mean(&name.value, declared.iter().copied()))
                    .with_hint(format!(
                        "declare it under `{}` (read from the environment variable `{}`)",
                        self.syntax("secrets:", "secrets = [...]"),
                        name.value
                    )),
                );
            }
        }
        if let Some(input) = &hook.input {
            if !self.spec.inputs.contains_key(input.value.as_str()) {
                self.unknown_input(input);
            } else if let Some((given, _)) = def.inputs.get_key_value(input.value.as_str()) {
                self.push(
                    Diagnostic::error(
                        codes::INVALID_VALUE,
                        given.span,
                        format!(
                            "input `{}` is the webhook's body: it cannot be given in `inputs` too",
                            input.value
                        ),
                    )
                    .with_label(input.span, "the body becomes this input"),
                );
            }
        }
    }

    /// The values a trigger gives: declared inputs only, each matching its schema, and every required
    /// input given (a webhook's body gives its `input`).
    fn check_trigger_inputs(&mut self, def: &TriggerDef, anchor: Span) {
        for (name, value) in &def.inputs {
            let Some(schema) = self.spec.inputs.get(name.value.as_str()) else {
                self.unknown_input(name);
                continue;
            };
            // A schema that does not compile is reported with the inputs.
            if let Ok(validator) = jsonschema::validator_for(&schema.to_json())
                && let Some(error) = validator.iter_errors(&value.to_json()).next()
            {
                let path = error.instance_path().to_string();
                let at = crate::validate::tools::pointer_segments(&path);
                let span = value.at_path(&at).map_or(value.span, |n: &Node| n.span);
                self.push(
                    Diagnostic::error(
                        codes::INVALID_INPUT,
                        span,
                        format!(
                            "value of input `{}` does not match its schema: {}",
                            name.value,
                            error.masked()
                        ),
                    )
                    .with_hint_opt(
                        schema
                            .get("description")
                            .and_then(Node::as_str)
                            .map(|d| format!("`{}`: {d}", name.value)),
                    ),
                );
            }
        }
        if def.cron.is_none() && def.webhook.is_none() {
            return;
        }
        let body = def
            .webhook
            .as_ref()
            .and_then(|h| h.input.as_ref())
            .map(|i| i.value.as_str());
        let missing: Vec<&str> = self
            .spec
            .inputs
            .iter()
            .filter(|(name, schema)| {
                schema.get("default").is_none()
                    && Some(name.value.as_str()) != body
                    && !def.inputs.contains_key(name.value.as_str())
            })
            .map(|(name, _)| name.value.as_str())
            .collect();
        if missing.is_empty() {
            return;
        }
        let example = missing.first().copied().unwrap_or_default();
        self.push(
            Diagnostic::error(
                codes::MISSING_INPUT,
                anchor,
                format!(
                    "the runs this trigger starts need the input{} {}",
                    if missing.len() == 1 { "" } else { "s" },
                    suggest::list(&missing)
                ),
            )
            .with_hint(self.syntax(
                &format!("give {} under the trigger's `inputs:`, for example `inputs: {{ {example}: ... }}`", if missing.len() == 1 { "it" } else { "them" }),
                &format!("give {} in the trigger's `inputs`, for example `inputs = {{ {example} = ... }}`", if missing.len() == 1 { "it" } else { "them" }),
            )),
        );
    }

    fn unknown_input(&mut self, name: &Spanned<String>) {
        let declared: Vec<&str> = self.spec.inputs.keys().map(|k| k.value.as_str()).collect();
        self.push(
            Diagnostic::error(
                codes::UNKNOWN_INPUT,
                name.span,
                format!("unknown input `{}`", name.value),
            )
            .with_hint_opt(suggest::did_you_mean(&name.value, declared.iter().copied()))
            .with_hint(if declared.is_empty() {
                "this workflow declares no inputs".to_owned()
            } else {
                format!("its inputs are {}", suggest::list(&declared))
            }),
        );
    }
}

/// Where a trigger is pointed at when a problem has no key of its own: its `cron` or `webhook` value,
/// else the entry.
fn trigger_anchor(trigger: &Spanned<TriggerDef>) -> Span {
    let def = &trigger.value;
    def.cron
        .as_ref()
        .map(|c| c.span)
        .or_else(|| def.webhook.as_ref().map(|w| w.span))
        .unwrap_or(trigger.span)
}
