"""``agentrl serve``'s API fuzzed against its own OpenAPI document (schemathesis): whatever
the request, the answer is never a server error and never a hang."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
schemathesis = pytest.importorskip("schemathesis")

from agentrl.policy import GPTConfig, Policy  # noqa: E402
from agentrl.policy.server import ServerThread  # noqa: E402
from conftest import TIME_SCALE  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402


@pytest.fixture(scope="module")
def api() -> Iterator[Any]:
    policy = Policy.builtin(
        GPTConfig(n_layer=1, n_head=2, d_model=16, max_seq_len=24), device="cpu"
    )
    # max_n and the short context bound the work one fuzzed request can ask for
    with ServerThread(policy, model_name="tiny", max_n=4, chat_max_tokens=4) as srv:
        yield schemathesis.openapi.from_url(srv.url + "/openapi.json")


def test_no_request_gets_a_server_error(api: Any) -> None:
    ops = [r.ok() for r in api.get_all_operations()]
    assert {op.path for op in ops} >= {"/v1/completions", "/v1/chat/completions", "/health"}
    modes = [GenerationMode.POSITIVE, GenerationMode.NEGATIVE]
    # GET operations take no input: nothing to make invalid
    for op, mode in itertools.product(ops, modes):
        if mode is GenerationMode.NEGATIVE and op.method.upper() == "GET":
            continue

        @given(case=op.as_strategy(generation_mode=mode))
        @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
        def check(case: Any) -> None:
            case.call_and_validate(checks=[not_a_server_error], timeout=30 * TIME_SCALE)

        check()
