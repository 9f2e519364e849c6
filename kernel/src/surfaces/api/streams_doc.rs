//! The document's account of the SSE endpoints: each stream's frames,
//! with the event name, the id and the data (a JSON text of a named
//! schema). The stream's media type gets the schema of one frame, as
//! OpenAPI 3.2's `itemSchema` says it and as the fuzzer checks each event.

use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Schema, Type};
use utoipa::openapi::{Ref, RefOr};
use utoipa::Modify;

/// One kind of frame: its event name (`None`: unnamed, which SSE reads as
/// `message`), the schema of its data, what its id is.
pub(super) type Frame = (Option<&'static str>, &'static str, &'static str);

/// The SSE endpoints, the name of their frame schema, and their frames.
pub(super) const STREAMS: &[(&str, &str, &[Frame])] = &[
    (
        "/v1/runs/{run}/events/stream",
        "RunEventFrame",
        &[(None, "Event", "the event's seq")],
    ),
    (
        "/v1/operations/{id}/console",
        "ConsoleFrame",
        &[
            (
                Some("output"),
                "ConsoleOutput",
                "the log offset after this chunk",
            ),
            (Some("done"), "ConsoleDone", "none: the stream's last frame"),
        ],
    ),
];

/// One frame's schema: its event name, id and JSON data.
fn frame_schema((event, data, id): &Frame) -> Schema {
    let content: utoipa::openapi::extensions::Extensions = [(
        "contentSchema".to_owned(),
        serde_json::to_value(Ref::from_schema_name(*data)).unwrap_or_default(),
    )]
    .into_iter()
    .collect();
    let data = ObjectBuilder::new()
        .schema_type(Type::String)
        .content_media_type("application/json")
        .description(Some(format!("A JSON text: `{data}`")))
        .extensions(Some(content));
    let name = ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some([event.unwrap_or("message")]));
    let id = ObjectBuilder::new()
        .schema_type(Type::String)
        .description(Some(format!("The SSE id: {id}")));
    let mut frame = ObjectBuilder::new()
        .property("event", name)
        .property("id", id)
        .property("data", data)
        .required("data");
    if event.is_some() {
        frame = frame.required("event");
    }
    Schema::Object(frame.build())
}

/// Adds each stream's frame schema and points its media type at it.
pub(super) struct Streams;

impl Modify for Streams {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        for (path, name, frames) in STREAMS {
            let schema = match frames {
                [one] => frame_schema(one),
                _ => {
                    let one_of = frames
                        .iter()
                        .fold(OneOfBuilder::new(), |b, f| b.item(frame_schema(f)));
                    Schema::OneOf(one_of.build())
                }
            };
            components
                .schemas
                .insert((*name).to_owned(), RefOr::T(schema));
            let answer = doc
                .paths
                .paths
                .get_mut(*path)
                .and_then(|item| item.get.as_mut())
                .and_then(|op| op.responses.responses.get_mut("200"));
            if let Some(RefOr::T(answer)) = answer {
                if let Some(content) = answer.content.get_mut("text/event-stream") {
                    content.schema = Some(RefOr::Ref(Ref::from_schema_name(*name)));
                }
            }
        }
    }
}
