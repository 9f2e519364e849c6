"""The client against the live kernel's OpenAPI document: every route the
client calls is in the document, every operation of the document is
called by the client or excluded below with a reason, and the answers'
TypedDicts name only fields the document's schemas have."""

from __future__ import annotations

import inspect
from typing import Set, Tuple

import pytest

import opkernel
from opkernel.types import SCHEMAS

# Operations of the document the client deliberately does not call, each
# with why. Keep it empty unless there is a reason: an operation added to
# the kernel fails this test until the client calls it or it is listed here.
EXCLUDED: Set[Tuple[str, str]] = set(
    # (method, path template): reason
)

METHODS = ("get", "put", "post", "delete", "patch")


@pytest.fixture(scope="module")
def document(op: opkernel.Client) -> dict:
    doc = op.openapi()
    assert doc["openapi"].startswith("3."), doc.get("openapi")
    return doc


def documented(document: dict) -> Set[Tuple[str, str]]:
    return {
        (method.upper(), path)
        for path, item in document["paths"].items()
        for method in METHODS
        if method in item
    }


def test_every_route_the_client_calls_is_documented(document: dict) -> None:
    missing = sorted(set(opkernel.ROUTES.values()) - documented(document))
    assert not missing, f"the client calls routes the document does not have: {missing}"


def test_every_documented_operation_is_called_or_excluded(document: dict) -> None:
    used = set(opkernel.ROUTES.values())
    uncovered = sorted(documented(document) - used - EXCLUDED)
    assert not uncovered, f"document operations the client does not call: {uncovered}"
    stale = sorted(EXCLUDED - documented(document))
    assert not stale, f"exclusions of operations the document no longer has: {stale}"
    both = sorted(EXCLUDED & used)
    assert not both, f"excluded operations the client calls anyway: {both}"


def test_the_route_table_has_no_duplicates() -> None:
    routes = list(opkernel.ROUTES.values())
    assert len(routes) == len(set(routes))


def test_every_route_is_sent_by_a_client_method() -> None:
    # each route name appears in the calls the client builds
    import opkernel._calls as calls_source
    import opkernel.client as client_source

    text = inspect.getsource(calls_source) + inspect.getsource(client_source)
    unused = [name for name in opkernel.ROUTES if f'"{name}"' not in text]
    assert not unused, f"routes no method sends: {unused}"


def _schema(document: dict, part: dict) -> dict:
    if "$ref" in part:
        return document["components"]["schemas"][part["$ref"].rsplit("/", 1)[1]]
    return part


def _fields(document: dict, schema: dict) -> Tuple[Set[str], Set[str]]:
    """A schema's properties and its required ones (through ``allOf``; a
    ``oneOf``'s properties are any variant's, its required all variants')."""
    props, required = set(schema.get("properties", {})), set(schema.get("required", []))
    for part in schema.get("allOf", []):
        more, needed = _fields(document, _schema(document, part))
        props, required = props | more, required | needed
    variants = [_fields(document, _schema(document, p)) for p in schema.get("oneOf", [])]
    if variants:
        props |= set.union(*(v[0] for v in variants))
        required |= set.intersection(*(v[1] for v in variants))
    return props, required


def test_typed_answers_match_the_documented_schemas(document: dict) -> None:
    wrong = {}
    for typed, name in SCHEMAS.items():
        props, required = _fields(document, document["components"]["schemas"][name])
        keys = set(typed.__annotations__)
        problems = {
            "not in the document": sorted(keys - props),
            "required there, not typed": sorted(required - keys),
            "required there, optional here": sorted(required & set(typed.__optional_keys__)),
            "optional there, required here": sorted(set(typed.__required_keys__) - required),
        }
        problems = {k: v for k, v in problems.items() if v}
        if problems:
            wrong[name] = problems
    assert not wrong, f"TypedDicts that disagree with the document: {wrong}"


def test_both_clients_have_the_same_methods_and_parameters() -> None:
    def public(cls) -> dict:
        return {
            name: [(p.name, p.kind, p.default) for p in inspect.signature(f).parameters.values()]
            for name, f in inspect.getmembers(cls, inspect.isfunction)
            if not name.startswith("_")
        }

    sync, both = public(opkernel.Client), public(opkernel.AsyncClient)
    assert sync.keys() == both.keys()
    for name in sync:
        assert sync[name] == both[name], name
    for name, f in inspect.getmembers(opkernel.AsyncClient, inspect.isfunction):
        if name.startswith("_") or name == "with_token":
            continue
        assert inspect.iscoroutinefunction(f) or inspect.isasyncgenfunction(f), name


def test_the_run_command_tool_schema_matches_the_client(op: opkernel.Client) -> None:
    tools = {t["name"]: t for t in op.tools()["tools"]}
    parameters = set(tools["run_command"]["parameters"]["properties"])
    client = set(inspect.signature(opkernel.Client.run_command).parameters)
    assert parameters <= client, parameters - client
    for tool in ("kill_operation", "write_stdin", "read_output", "resize_tty"):
        assert tool in tools and hasattr(opkernel.Client, tool), tool


def test_the_package_parses_as_python_3_9() -> None:
    import ast
    from pathlib import Path

    for source in Path(opkernel.__file__).parent.glob("*.py"):
        ast.parse(source.read_text(), str(source), feature_version=(3, 9))
