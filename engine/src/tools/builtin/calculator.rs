//! The `calculator` tool: arithmetic on numbers only (`+ - * / % ^`, parentheses, unary minus), parsed by
//! hand so that nothing else can be evaluated.

use serde_json::{Value as Json, json};

use super::{READ_ONLY, Tool, ToolContext, ToolError, ToolOutput, Watcher, object};
use crate::tools::{CallFuture, SafetyRule};

pub(super) struct Calculator;

impl Tool for Calculator {
    fn name(&self) -> &'static str {
        "calculator"
    }

    fn description(&self) -> &'static str {
        "Evaluate an arithmetic expression"
    }

    fn parameters(&self) -> Json {
        object(
            json!({ "expression": { "type": "string" } }),
            &["expression"],
        )
    }

    fn safety(&self) -> SafetyRule {
        READ_ONLY
    }

    fn call<'a>(&'a self, args: Json, _: &'a ToolContext, _: Watcher<'a>) -> CallFuture<'a> {
        Box::pin(async move {
            let value = evaluate(args["expression"].as_str().unwrap_or_default())?;
            // Whole numbers print as integers.
            let output = if value.fract() == 0.0 && value.abs() < 9e15 {
                json!(value as i64)
            } else {
                json!(value)
            };
            Ok(ToolOutput::json(output))
        })
    }
}

/// Evaluates an arithmetic expression.
pub fn evaluate(expression: &str) -> Result<f64, ToolError> {
    let mut parser = Parser {
        chars: expression.chars().filter(|c| !c.is_whitespace()).collect(),
        at: 0,
        depth: 0,
    };
    let value = parser.sum()?;
    if parser.at != parser.chars.len() {
        return Err(parser.error("unexpected"));
    }
    if value.is_finite() {
        Ok(value)
    } else {
        Err(ToolError::new(format!(
            "`{expression}` has no finite value"
        )))
    }
}

struct Parser {
    chars: Vec<char>,
    at: usize,
    depth: usize,
}

impl Parser {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    fn error(&self, what: &str) -> ToolError {
        match self.peek() {
            Some(c) => ToolError::new(format!(
                "{what} `{c}` at position {} of the expression",
                self.at + 1
            )),
            None => ToolError::new("the expression ends too early"),
        }
    }

    fn sum(&mut self) -> Result<f64, ToolError> {
        let mut value = self.product()?;
        while let Some(op @ ('+' | '-')) = self.peek() {
            self.at += 1;
            let right = self.product()?;
            value = if op == '+' {
                value + right
            } else {
                value - right
            };
        }
        Ok(value)
    }

    fn product(&mut self) -> Result<f64, ToolError> {
        let mut value = self.power()?;
        while let Some(op @ ('*' | '/' | '%')) = self.peek() {
            self.at += 1;
            let right = self.power()?;
            if op != '*' && right == 0.0 {
                return Err(ToolError::new("division by zero"));
            }
            value = match op {
                '*' => value * right,
                '/' => value / right,
                _ => value % right,
            };
        }
        Ok(value)
    }

    fn power(&mut self) -> Result<f64, ToolError> {
        let base = self.unary()?;
        if self.peek() == Some('^') {
            self.at += 1;
            let exponent = self.power()?;
            return Ok(base.powf(exponent));
        }
        Ok(base)
    }

    fn unary(&mut self) -> Result<f64, ToolError> {
        match self.peek() {
            Some('-') => {
                self.at += 1;
                Ok(-self.unary()?)
            }
            Some('+') => {
                self.at += 1;
                self.unary()
            }
            _ => self.atom(),
        }
    }

    fn atom(&mut self) -> Result<f64, ToolError> {
        match self.peek() {
            Some('(') => {
                self.depth += 1;
                if self.depth > 64 {
                    return Err(ToolError::new(
                        "the expression nests parentheses too deeply",
                    ));
                }
                self.at += 1;
                let value = self.sum()?;
                if self.peek() != Some(')') {
                    return Err(self.error("expected `)`, found"));
                }
                self.at += 1;
                self.depth -= 1;
                Ok(value)
            }
            Some(c) if c.is_ascii_digit() || c == '.' => {
                let start = self.at;
                while self.peek().is_some_and(|c| c.is_ascii_digit() || c == '.') {
                    self.at += 1;
                }
                if matches!(self.peek(), Some('e' | 'E')) {
                    self.at += 1;
                    if matches!(self.peek(), Some('+' | '-')) {
                        self.at += 1;
                    }
                    while self.peek().is_some_and(|c| c.is_ascii_digit()) {
                        self.at += 1;
                    }
                }
                let text: String = self.chars[start..self.at].iter().collect();
                text.parse()
                    .map_err(|_| ToolError::new(format!("`{text}` is not a number")))
            }
            _ => Err(self.error("unexpected")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::evaluate;

    #[test]
    fn arithmetic_follows_precedence() {
        assert_eq!(evaluate("50 * 20 / 100").ok(), Some(10.0));
        assert_eq!(evaluate("2 + 3 * 4 ^ 2").ok(), Some(50.0));
        assert_eq!(
            evaluate("2 ^ 3 ^ 2").ok(),
            Some(512.0),
            "power is right-associative"
        );
        assert_eq!(evaluate("-(1.5 + 0.5) * 1e2").ok(), Some(-200.0));
        assert_eq!(evaluate("7 % 4").ok(), Some(3.0));
    }

    #[test]
    fn anything_else_is_refused() {
        for bad in [
            "1 / 0",
            "2 +",
            "abs(1)",
            "1; rm -rf /",
            "((1)",
            "",
            "1e999 * 10",
        ] {
            assert!(evaluate(bad).is_err(), "{bad} was accepted");
        }
        assert!(evaluate(&format!("{}1{}", "(".repeat(100), ")".repeat(100))).is_err());
    }
}
