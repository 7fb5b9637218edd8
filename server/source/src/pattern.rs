//! [`parse_spec`](crate::parse_spec)'s grammar as one RE2 pattern, for the
//! CRD's CEL rule. The tests run both over the same table.

/// The pattern `spec.model.source` must match (RE2, as CEL's `matches` reads it).
pub const SPEC_PATTERN: &str = concat!(
    "^(",
    // hf://ORG/NAME[@REVISION][/FILE]
    r"hf://",
    r"(\.\.[^/@\s\\]+|\.[^./@\s\\][^/@\s\\]*|[^./@\s\\][^/@\s\\]*)",
    "/",
    r"(\.\.[^/@\s\\]+|\.[^./@\s\\][^/@\s\\]*|[^./@\s\\][^/@\s\\]*)",
    r"(@(refs/[^/\s]+/[^/\s]+|[^/\s]+))?",
    r"(/(\.\.[^/\s\\]+|\.[^./\s\\][^/\s\\]*|[^./\s\\][^/\s\\]*))*",
    // pvc://CLAIM/[PATH[/]]
    r"|pvc://[a-z0-9]([-a-z0-9.]*[a-z0-9])?/",
    r"((\.\.[^/\s\\]+|\.[^./\s\\][^/\s\\]*|[^./\s\\][^/\s\\]*)",
    r"(/(\.\.[^/\s\\]+|\.[^./\s\\][^/\s\\]*|[^./\s\\][^/\s\\]*))*/?)?",
    // file:///ABS
    r"|file:///\S+",
    // https://HOST/[...]/NAME[?query][#fragment]
    r"|https://[^/?#\s]+/([^?#\s]*/)?",
    r"(\.\.[^/?#\s]+|\.[^./?#\s][^/?#\s]*|[^./?#\s][^/?#\s]*)([?#]\S*)?",
    ")$",
);

/// The CEL rule for `spec.model.source`: [`SPEC_PATTERN`] in a CEL string literal.
pub fn cel_rule() -> String {
    let literal = SPEC_PATTERN.replace('\\', r"\\").replace('\'', r"\'");
    format!("self.matches('{literal}')")
}

/// The pattern back out of a CEL rule made by [`cel_rule`] (for tests that
/// read the rule from the generated CRD).
pub fn pattern_of_cel_rule(rule: &str) -> Option<String> {
    let literal = rule.strip_prefix("self.matches('")?.strip_suffix("')")?;
    let mut out = String::with_capacity(literal.len());
    let mut chars = literal.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            out.push(chars.next()?);
        } else {
            out.push(c);
        }
    }
    Some(out)
}
