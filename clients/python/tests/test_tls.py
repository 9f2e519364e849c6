"""TLS: a kernel served over ``https://`` with a private CA is trusted
through ``ca=`` or ``OPKERNEL_CA``, and refused without them. Needs a
second live kernel serving TLS: ``OPKERNEL_TLS_URL``,
``OPKERNEL_TLS_OPERATOR_TOKEN`` and ``OPKERNEL_TLS_CA`` (its CA's PEM)."""

from __future__ import annotations

import asyncio
import os
import ssl
from typing import Tuple

import pytest
from conftest import fresh_id

import opkernel


@pytest.fixture(scope="module")
def tls_kernel() -> Tuple[str, str, str]:
    names = ("OPKERNEL_TLS_URL", "OPKERNEL_TLS_OPERATOR_TOKEN", "OPKERNEL_TLS_CA")
    values = [os.environ.get(n) for n in names]
    if not all(values):
        pytest.fail(f"{', '.join(names)} must name a live kernel serving TLS")
    url, token, ca = (v or "" for v in values)
    assert url.startswith("https://"), url
    return url, token.strip(), ca


def test_the_ca_argument_is_trusted(tls_kernel: Tuple[str, str, str], monkeypatch) -> None:
    url, token, ca = tls_kernel
    monkeypatch.delenv("OPKERNEL_CA", raising=False)
    with opkernel.Client(url, token, ca=ca) as client:
        made = client.create_run(fresh_id("tls"))
        done = client.run_command(made["run_id"], ["echo", "over tls"])
        assert done["exit_code"] == 0 and "over tls" in done["output"]
        client.cancel_run(made["run_id"])


def test_opkernel_ca_is_trusted_and_an_ssl_context_too(
    tls_kernel: Tuple[str, str, str], monkeypatch
) -> None:
    url, token, ca = tls_kernel
    monkeypatch.setenv("OPKERNEL_CA", ca)
    with opkernel.Client(url, token) as client:
        assert client.whoami()["principal"] == "operator"
    monkeypatch.delenv("OPKERNEL_CA")
    context = ssl.create_default_context(cafile=ca)
    with opkernel.Client(url, token, ca=context) as client:
        assert client.health()["ok"] is True


def test_without_the_ca_the_kernel_is_not_trusted(
    tls_kernel: Tuple[str, str, str], monkeypatch
) -> None:
    url, token, _ = tls_kernel
    monkeypatch.delenv("OPKERNEL_CA", raising=False)
    with opkernel.Client(url, token, max_retries=0) as client:
        with pytest.raises(opkernel.TransportError) as refused:
            client.health()
    assert "CERTIFICATE_VERIFY_FAILED" in str(refused.value)


def test_the_async_client_over_tls(tls_kernel: Tuple[str, str, str], monkeypatch) -> None:
    url, token, ca = tls_kernel
    monkeypatch.delenv("OPKERNEL_CA", raising=False)

    async def flow() -> None:
        async with opkernel.AsyncClient(url, token, ca=ca) as client:
            made = await client.create_run(fresh_id("tls"))
            started = await client.run_command(made["run_id"], ["echo", "bg"], background=True)
            frames = [f async for f in client.console(started["operation_id"])]
            assert frames[-1]["event"] == "done" and frames[-1]["data"]["exit_code"] == 0
            await client.cancel_run(made["run_id"])

    asyncio.run(flow())
