"""Checks SSE frames a live kernel sent against its OpenAPI document.

Usage: check_frames.py DOCUMENT FRAMES. FRAMES is a JSON list of
{"path", "event", "id", "data"} as read off the wire ("event" null for an
unnamed frame). Each frame must match its stream's frame schema, and its
data (JSON text) the schema the frame names. Prints one line per failure
and exits 1 when any; prints how many were checked otherwise.
"""

import json
import sys

from jsonschema import Draft202012Validator


def frame_variants(doc, path):
    ref = doc["paths"][path]["get"]["responses"]["200"]["content"]["text/event-stream"]["schema"]["$ref"]
    schema = doc["components"]["schemas"][ref.rsplit("/", 1)[1]]
    return schema.get("oneOf", [schema])


def validator(doc, schema):
    return Draft202012Validator({**schema, "components": doc["components"]})


def main():
    doc = json.load(open(sys.argv[1]))
    frames = json.load(open(sys.argv[2]))
    failures = []
    for f in frames:
        wire = {k: f[k] for k in ("event", "id", "data") if f.get(k) is not None}
        # an unnamed frame is a `message` (the SSE default)
        name = f.get("event") or "message"
        named = [v for v in frame_variants(doc, f["path"])
                 if v["properties"]["event"]["enum"] == [name]]
        if len(named) != 1:
            failures.append(f"{f['path']}: no frame named {f.get('event')!r} in the document")
            continue
        variant = named[0]
        for e in validator(doc, variant).iter_errors(wire):
            failures.append(f"{f['path']} frame {wire}: {e.message}")
        data = json.loads(f["data"])
        content = variant["properties"]["data"]["contentSchema"]
        for e in validator(doc, content).iter_errors(data):
            failures.append(f"{f['path']} {f.get('event')} data {data}: {e.message}")
    for line in failures:
        print(line)
    if failures:
        sys.exit(1)
    print(f"{len(frames)} frames match the document")


main()
