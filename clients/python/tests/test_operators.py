"""The operators' views (containers, inspect, the reaper, nodes) and a
run's network policy."""

from __future__ import annotations

from typing import Dict

import pytest

import opkernel


def test_containers_and_inspect(op: opkernel.Client, run: Dict[str, str], agent) -> None:
    agent.run_command(run["run_id"], ["true"])
    containers = op.list_containers()["containers"]
    mine = [c for c in containers if c.get("run_id") == run["run_id"]]
    assert len(mine) == 1, containers
    seen = op.inspect(run["run_id"])
    assert seen["container_id"] == mine[0]["container_id"]
    assert op.inspect(mine[0]["container_id"][:12])["container_id"] == mine[0]["container_id"]
    with pytest.raises(opkernel.ApiError) as operator_only:
        agent.list_containers()
    assert operator_only.value.status == 403


def test_the_reaper_dry_run_keeps_live_runs(op: opkernel.Client, run: Dict[str, str], agent) -> None:
    agent.run_command(run["run_id"], ["true"])
    answer = op.reap(dry_run=True)
    assert answer["dry_run"] is True
    mine = [d for d in answer["decisions"] if d.get("run_id") == run["run_id"]]
    assert [(d["action"], d["removed"]) for d in mine] == [("keep", False)], mine
    assert op.inspect(run["run_id"])["container_id"] == mine[0]["container_id"]


def test_nodes_of_a_single_kernel(op: opkernel.Client) -> None:
    assert op.list_nodes()["nodes"] == []
    for change in (op.drain_node, op.activate_node):
        with pytest.raises(opkernel.ApiError) as none:
            change("nowhere")
        assert none.value.status == 404 and none.value.code == "not_found"


def test_an_allow_list_is_narrowed(op: opkernel.Client, new_run, run: Dict[str, str]) -> None:
    made = new_run("net", envelope={"network": {"allow": ["pypi.org", "example.com:443"]}})
    with op.with_token(made["token"]) as agent:
        changed = agent.change_network(made["run_id"], ["pypi.org"])
        assert changed["allow"] == ["pypi.org"] and changed["run_id"] == made["run_id"]
        with pytest.raises(opkernel.ApiError) as wider:
            agent.change_network(made["run_id"], ["pypi.org", "evil.example"])
        assert wider.value.status == 403 and wider.value.code == "envelope_exceeded"
    assert op.get_run(made["run_id"])["envelope"]["network"] == {"allow": ["pypi.org"]}
    with pytest.raises(opkernel.ApiError) as default:
        op.change_network(run["run_id"], ["pypi.org"])
    assert default.value.status == 409 and default.value.code == "not_allow_list"
