//! The integration tests: one binary, one module per area.

mod agent;
mod architecture;
mod cli;
mod conformance;
mod durable;
mod hardening;
mod hostile;
mod journal;
mod llm;
mod llm_anthropic;
mod llm_gemini;
mod llm_openai;
mod nested;
mod plan;
mod planner;
mod process;
mod properties;
mod rules;
mod run;
mod schema;
mod security;
mod session;
mod store;
mod support;
mod validate_fixtures;
mod workflows;
