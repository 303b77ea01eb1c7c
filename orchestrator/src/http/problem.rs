//! RFC 7807 problem responses.

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

/// The JSON of every error answer (RFC 7807).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ProblemBody {
    /// `https://vcp.dev/problems/<slug>`: stable, for programs to match on.
    #[serde(rename = "type")]
    pub type_: String,
    pub title: String,
    pub status: u16,
    /// What went wrong, for people.
    pub detail: String,
    /// The request field at fault (`name`, `groups`, `body`, ...), when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

// Problem answers many routes share, for their OpenAPI documentation.

/// 401 on every `/v1` route.
#[derive(utoipa::IntoResponses)]
pub enum Unauthorized {
    #[response(
        status = 401,
        description = "no, unknown or revoked token",
        content_type = "application/problem+json"
    )]
    Unauthorized(ProblemBody),
}

/// 403 on the admin routes.
#[derive(utoipa::IntoResponses)]
pub enum AdminOnly {
    #[response(
        status = 403,
        description = "the caller is not an admin",
        content_type = "application/problem+json"
    )]
    Forbidden(ProblemBody),
}

/// 404 on the routes of one tenant.
#[derive(utoipa::IntoResponses)]
pub enum NoSuchTenant {
    #[response(
        status = 404,
        description = "no such tenant (none of `owner`'s, when given), or another owner's",
        content_type = "application/problem+json"
    )]
    NotFound(ProblemBody),
}

/// Bodies refused before their fields are looked at.
#[derive(utoipa::IntoResponses)]
pub enum BodyRefused {
    #[response(
        status = 400,
        description = "not JSON",
        content_type = "application/problem+json"
    )]
    Malformed(ProblemBody),
    #[response(
        status = 413,
        description = "body over 64 KiB",
        content_type = "application/problem+json"
    )]
    TooLarge(ProblemBody),
    #[response(
        status = 415,
        description = "not application/json",
        content_type = "application/problem+json"
    )]
    NotJson(ProblemBody),
    #[response(
        status = 408,
        description = "body not received whole within the body timeout of its head (`vcp serve --http-body-timeout-seconds`, 30 s by default); the connection is closed",
        content_type = "application/problem+json"
    )]
    TooSlow(ProblemBody),
}

/// Bodies refused by routes that take none (`NoBody` in `api`).
#[derive(utoipa::IntoResponses)]
pub enum NoBodyTaken {
    #[response(
        status = 413,
        description = "body over 64 KiB",
        content_type = "application/problem+json"
    )]
    TooLarge(ProblemBody),
    #[response(
        status = 422,
        description = "a body other than none or `{}`: this route takes no body, and refuses a field rather than ignore it (`field` names one, or is `body`)",
        content_type = "application/problem+json"
    )]
    Refused(ProblemBody),
}

/// A problem+json response.
#[derive(Debug)]
pub struct Problem {
    status: StatusCode,
    slug: &'static str,
    title: &'static str,
    detail: String,
    field: Option<String>,
}

impl Problem {
    pub fn new(
        status: StatusCode,
        slug: &'static str,
        title: &'static str,
        detail: &str,
        field: Option<&str>,
    ) -> Problem {
        Problem {
            status,
            slug,
            title,
            detail: detail.to_owned(),
            field: field.map(str::to_owned),
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The request field at fault, if any.
    pub fn field(&self) -> Option<&str> {
        self.field.as_deref()
    }

    pub fn invalid(field: &str, detail: &str) -> Problem {
        Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-field",
            "invalid field",
            detail,
            Some(field),
        )
    }

    pub fn conflict(field: &str, detail: &str) -> Problem {
        Problem::new(
            StatusCode::CONFLICT,
            "conflict",
            "conflict",
            detail,
            Some(field),
        )
    }

    pub fn not_found(detail: &str) -> Problem {
        Problem::new(
            StatusCode::NOT_FOUND,
            "not-found",
            "not found",
            detail,
            None,
        )
    }

    pub fn unauthorized(detail: &str) -> Problem {
        Problem::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "unauthorized",
            detail,
            None,
        )
    }

    /// A 500 that tells the caller nothing; the cause goes to the log.
    pub fn internal(e: &crate::Error) -> Problem {
        tracing::error!(error = %e.public(), cause = ?e, "request failed");
        Problem::opaque()
    }

    /// The body of every 500: nothing about internals.
    pub fn opaque() -> Problem {
        Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error",
            "the request failed; see the server log",
            None,
        )
    }

    pub fn forbidden(detail: &str) -> Problem {
        Problem::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "forbidden",
            detail,
            None,
        )
    }

    /// Malformed, oversize or mistyped JSON bodies.
    pub fn from_rejection(r: JsonRejection) -> Problem {
        let status = r.status();
        let detail = r.body_text();
        let field = field_of(&detail);
        let (slug, title) = match status {
            StatusCode::PAYLOAD_TOO_LARGE => ("too-large", "request body too large"),
            StatusCode::UNSUPPORTED_MEDIA_TYPE => {
                ("unsupported-media-type", "expected application/json")
            }
            StatusCode::UNPROCESSABLE_ENTITY => ("invalid-field", "invalid field"),
            _ => ("malformed", "malformed request body"),
        };
        Problem {
            status: if status.is_client_error() {
                status
            } else {
                StatusCode::BAD_REQUEST
            },
            slug,
            title,
            detail,
            field: field.or_else(|| Some("body".into())),
        }
    }
}

impl Problem {
    /// A query string that does not decode into the route's parameters (400), naming the
    /// parameter when the decoder does (`limit: invalid digit`, ``duplicate field `since` ``).
    pub fn from_query_rejection(r: QueryRejection) -> Problem {
        let detail = r.body_text();
        let field = query_field(&detail).unwrap_or_else(|| "query".to_owned());
        Problem::new(
            StatusCode::BAD_REQUEST,
            "malformed",
            "malformed query",
            &detail,
            Some(&field),
        )
    }
}

fn query_field(detail: &str) -> Option<String> {
    if let Some(rest) = detail.split("duplicate field `").nth(1) {
        return rest.split('`').next().map(str::to_owned);
    }
    let (field, _) = detail.split("query string: ").nth(1)?.split_once(": ")?;
    (!field.is_empty() && !field.contains(' ')).then(|| field.to_owned())
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let body = ProblemBody {
            type_: format!("https://vcp.dev/problems/{}", self.slug),
            title: self.title.to_owned(),
            status: self.status.as_u16(),
            detail: self.detail,
            field: self.field,
        };
        (
            self.status,
            [(header::CONTENT_TYPE, "application/problem+json")],
            serde_json::to_string(&body).unwrap_or_default(),
        )
            .into_response()
    }
}

/// The field a serde error is about: `unknown field `x``, `missing field `x``, or the path
/// that axum puts before the message (`...target type: spec.name: invalid type...`).
fn field_of(detail: &str) -> Option<String> {
    // The path to the value at fault, when it is inside an object (`selector: unknown ...`).
    let path = detail
        .split("target type: ")
        .nth(1)
        .and_then(|r| r.split(": ").next())
        .filter(|p| !p.is_empty() && !p.contains(' '));
    for marker in ["unknown field `", "missing field `"] {
        if let Some(rest) = detail.split(marker).nth(1) {
            let field = rest.split('`').next()?;
            // The path may end with the field already (`selector.colour: unknown field
            // `colour``) or name the object holding it.
            return Some(match path {
                Some(p) if p == field || p.ends_with(&format!(".{field}")) => p.to_owned(),
                Some(p) => format!("{p}.{field}"),
                None => field.to_owned(),
            });
        }
    }
    path.map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::{field_of, query_field};

    #[test]
    fn query_decoder_messages_name_their_parameter() {
        let p = "Failed to deserialize query string: ";
        assert_eq!(
            query_field(&format!("{p}limit: invalid digit found in string")).as_deref(),
            Some("limit")
        );
        assert_eq!(
            query_field(&format!("{p}duplicate field `since`")).as_deref(),
            Some("since")
        );
        assert_eq!(query_field(&format!("{p}invalid utf-8 sequence")), None);
    }

    #[test]
    fn serde_messages_name_their_field() {
        let p = "Failed to deserialize the JSON body into the target type: ";
        assert_eq!(
            field_of(&format!(
                "{p}name: invalid type: integer `7`, expected a string at line 1 column 9"
            ))
            .as_deref(),
            Some("name")
        );
        assert_eq!(
            field_of(&format!(
                "{p}unknown field `colour`, expected one of `name`"
            ))
            .as_deref(),
            Some("colour")
        );
        assert_eq!(
            field_of(&format!("{p}missing field `name` at line 1 column 2")).as_deref(),
            Some("name")
        );
        assert_eq!(
            field_of(&format!(
                "{p}selector.colour: unknown field `colour`, expected one of `labels`, `names`, `version` at line 1 column 21"
            ))
            .as_deref(),
            Some("selector.colour")
        );
        assert_eq!(
            field_of(&format!(
                "{p}selector: missing field `target` at line 1 column 2"
            ))
            .as_deref(),
            Some("selector.target")
        );
        assert_eq!(
            field_of("Failed to parse the request body as JSON: EOF while parsing"),
            None
        );
    }
}
