//! What calls cost: a built-in table of list prices for well-known models, which a provider's `pricing` in
//! the spec overrides. Prices are USD per million tokens, as the providers published them for the models
//! below; they change, so a spec that cares about exact cost should state its own. A model that is neither
//! in the table nor priced by its spec has no known cost (local servers, new models): calls are counted and
//! their tokens summed, and `max_cost_usd` cannot be enforced for them.

use serde::Serialize;

use super::Usage;
use crate::spec::Pricing;

/// USD per million tokens.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Price {
    pub input: f64,
    pub output: f64,
    /// Cached input tokens, when the provider bills them differently.
    pub cached_input: Option<f64>,
}

impl From<&Pricing> for Price {
    fn from(p: &Pricing) -> Self {
        Price {
            input: p.input_per_mtok,
            output: p.output_per_mtok,
            cached_input: p.cached_input_per_mtok,
        }
    }
}

/// Model name prefixes and their list prices; the longest matching prefix wins.
const TABLE: &[(&str, Price)] = &[
    ("gpt-4o-mini", price(0.15, 0.60, Some(0.075))),
    ("gpt-4o", price(2.50, 10.00, Some(1.25))),
    ("gpt-4.1-nano", price(0.10, 0.40, Some(0.025))),
    ("gpt-4.1-mini", price(0.40, 1.60, Some(0.10))),
    ("gpt-4.1", price(2.00, 8.00, Some(0.50))),
    ("o3-mini", price(1.10, 4.40, Some(0.55))),
    ("o4-mini", price(1.10, 4.40, Some(0.275))),
    ("claude-3-5-haiku", price(0.80, 4.00, Some(0.08))),
    ("claude-3-5-sonnet", price(3.00, 15.00, Some(0.30))),
    ("claude-3-7-sonnet", price(3.00, 15.00, Some(0.30))),
    ("claude-sonnet-4", price(3.00, 15.00, Some(0.30))),
    ("claude-opus-4", price(15.00, 75.00, Some(1.50))),
    ("claude-opus-4-5", price(5.00, 25.00, Some(0.50))),
    ("gemini-2.0-flash-lite", price(0.075, 0.30, None)),
    ("gemini-2.0-flash", price(0.10, 0.40, Some(0.025))),
    ("gemini-2.5-flash", price(0.30, 2.50, Some(0.075))),
    ("gemini-2.5-pro", price(1.25, 10.00, Some(0.31))),
];

const fn price(input: f64, output: f64, cached_input: Option<f64>) -> Price {
    Price {
        input,
        output,
        cached_input,
    }
}

/// The price of `model`: the spec's `pricing` when given, else the table's longest matching prefix.
pub fn price_of(model: &str, configured: Option<&Pricing>) -> Option<Price> {
    if let Some(pricing) = configured {
        return Some(pricing.into());
    }
    TABLE
        .iter()
        .filter(|(prefix, _)| model.starts_with(prefix))
        .max_by_key(|(prefix, _)| prefix.len())
        .map(|(_, price)| *price)
}

/// What `usage` costs at `price`, in USD.
pub fn cost(usage: &Usage, price: &Price) -> f64 {
    let cached = usage.cached_input_tokens.min(usage.input_tokens);
    let fresh = usage.input_tokens - cached;
    let cached_rate = price.cached_input.unwrap_or(price.input);
    (fresh as f64 * price.input
        + cached as f64 * cached_rate
        + usage.output_tokens as f64 * price.output)
        / 1_000_000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_prefix_wins_and_the_spec_overrides() {
        let mini = price_of("gpt-4o-mini-2024-07-18", None).expect("known");
        assert!((mini.input - 0.15).abs() < f64::EPSILON);
        assert!(price_of("llama-3.2-1b", None).is_none());
        let own = Pricing {
            input_per_mtok: 1.0,
            output_per_mtok: 2.0,
            cached_input_per_mtok: None,
        };
        let usage = Usage {
            input_tokens: 1_000_000,
            output_tokens: 500_000,
            cached_input_tokens: 0,
        };
        let price = price_of("gpt-4o", Some(&own)).expect("configured");
        assert!((cost(&usage, &price) - 2.0).abs() < 1e-9);
        let cached = Usage {
            cached_input_tokens: 1_000_000,
            ..usage
        };
        assert!((cost(&cached, &mini) - (0.075 + 0.30)).abs() < 1e-9);
    }
}
