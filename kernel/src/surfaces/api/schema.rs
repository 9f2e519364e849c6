//! Schemas of the API document (`openapi.rs`) that a derive cannot say,
//! for the request types to name (a leaf: it imports no handler).

/// The schema of an argv (`command` of a start or a schedule): at least
/// one argument, the first non-empty, none holding a NUL (the whole at
/// most 256 KiB, which a schema cannot say).
pub fn argv() -> utoipa::openapi::schema::Array {
    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Type};
    let arg = |min_length: Option<usize>| {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(min_length)
            .pattern(Some(r"^[^\u0000]*$"))
            .build()
    };
    ArrayBuilder::new()
        .prefix_items([arg(Some(1))])
        .items(arg(None))
        .min_items(Some(1))
        .description(Some(
            "The argv: a program and its arguments (no shell unless asked for)",
        ))
        .build()
}
