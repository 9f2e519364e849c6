"""A run's files: upload and download (whole, ranged, streamed), listings,
the file tools, tar archives, deletion, snapshots and forks."""

from __future__ import annotations

import io
import os
import tarfile
from typing import Dict

import pytest
from conftest import fresh_id, remember

import opkernel

BLOB = bytes(range(256)) * 64 + os.urandom(4096)


def test_an_uploaded_file_downloads_the_same_and_commands_see_it(
    agent: opkernel.Client, run: Dict[str, str]
) -> None:
    run_id = run["run_id"]
    written = agent.upload_file(run_id, "/scratch/pyc/in/data.bin", BLOB, mode="600")
    assert written["bytes"] == len(BLOB)
    assert agent.download_file(run_id, "/scratch/pyc/in/data.bin") == BLOB
    assert agent.download_file(run_id, "scratch/pyc/in/data.bin", start=10, end=19) == BLOB[10:20]
    assert agent.download_file(run_id, "/scratch/pyc/in/data.bin", start=len(BLOB) - 5) == BLOB[-5:]
    seen = agent.run_command(run_id, ["sh", "-c", "wc -c < /scratch/pyc/in/data.bin"])
    assert seen["output"].strip() == str(len(BLOB))
    entries = {e["name"]: e for e in agent.list_files(run_id, "/scratch/pyc/in")["entries"]}
    assert entries["data.bin"]["size"] == len(BLOB) and entries["data.bin"]["type"] == "file"
    assert entries["data.bin"]["mode"].endswith("600")


def test_a_streamed_upload_and_a_name_needing_quoting(
    agent: opkernel.Client, run: Dict[str, str]
) -> None:
    run_id = run["run_id"]
    chunks = (BLOB[i : i + 1000] for i in range(0, len(BLOB), 1000))
    path = "/scratch/pyc/a dir/x#y?.bin"
    assert agent.upload_file(run_id, path, chunks)["bytes"] == len(BLOB)
    assert agent.download_file(run_id, path) == BLOB
    agent.delete_file(run_id, path)
    with pytest.raises(opkernel.ApiError) as gone:
        agent.download_file(run_id, path)
    assert gone.value.status == 404


def test_the_file_tools(agent: opkernel.Client, run: Dict[str, str]) -> None:
    run_id = run["run_id"]
    agent.write_file(run_id, "/scratch/pyc/tool.txt", "héllo\nworld\n")
    read = agent.read_file(run_id, "/scratch/pyc/tool.txt", offset=7)
    assert read["content"] == "world\n" and read["eof"] is True
    agent.write_file(run_id, "/scratch/pyc/raw.bin", data=b"\x00\xff", mode="644")
    raw = agent.read_file(run_id, "/scratch/pyc/raw.bin", encoding="base64")
    assert raw["content"] == "AP8=" and raw["encoding"] == "base64"
    names = {e["name"] for e in agent.list_dir(run_id, "/scratch/pyc")["entries"]}
    assert {"tool.txt", "raw.bin"} <= names


def test_archives_round_trip(agent: opkernel.Client, run: Dict[str, str]) -> None:
    run_id = run["run_id"]
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w") as tar:
        for name, data in (("a.txt", b"alpha\n"), ("sub/b.bin", BLOB)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    agent.upload_archive(run_id, "/scratch/pyc/arch", packed.getvalue())
    assert agent.run_command(run_id, ["cat", "/scratch/pyc/arch/a.txt"])["output"] == "alpha\n"
    back = tarfile.open(fileobj=io.BytesIO(agent.download_archive(run_id, "/scratch/pyc/arch")))
    members = {m.name.lstrip("./"): m for m in back.getmembers() if m.isfile()}
    assert back.extractfile(members["sub/b.bin"]).read() == BLOB  # type: ignore[union-attr]
    agent.delete_file(run_id, "/scratch/pyc/arch", recursive=True)
    assert "arch" not in {e["name"] for e in agent.list_files(run_id, "/scratch/pyc/")["entries"]}


def test_a_snapshot_seeds_a_fork(
    agent: opkernel.Client, op: opkernel.Client, run: Dict[str, str]
) -> None:
    run_id = run["run_id"]
    agent.upload_file(run_id, "/scratch/pyc/snap.txt", b"before")
    snap = agent.make_snapshot(run_id, "s1")
    assert snap["name"] == "s1"
    assert "s1" in {s["name"] for s in agent.list_snapshots(run_id)["snapshots"]}
    agent.upload_file(run_id, "/scratch/pyc/snap.txt", b"after")
    fork = op.create_run(fresh_id("fork"), fork_from=f"{run_id}@s1")
    remember(fork["run_id"])
    assert fork["forked_from"] == f"{run_id}@s1"
    assert op.download_file(fork["run_id"], "/scratch/pyc/snap.txt") == b"before"


def test_files_outside_the_run_are_refused(agent: opkernel.Client, run: Dict[str, str]) -> None:
    with pytest.raises(opkernel.ApiError) as other:
        agent.download_file("pyc-someone-else", "/scratch/x")
    assert other.value.status == 403
