"""The wait for the rendezvous address to resolve (bounded, backing off) and the hint it gives when it never does."""

from __future__ import annotations

import pytest

from train.common.errors import UserError
from train.launch import rendezvous


def unresolvable(host):
    raise OSError("Name or service not known")


def test_wait_for_address_retries_then_resolves():
    answers = [OSError("Name or service not known")] * 2 + [None]
    slept, logged = [], []

    def resolve(host):
        answer = answers.pop(0)
        if answer:
            raise answer

    failures = rendezvous.wait_for_address(
        "mlm-master-0", "MASTER_ADDR", 60, logged.append, rendezvous.Lookup(resolve, slept.append)
    )
    assert failures == 2 and slept == [1.0, 2.0]
    assert "waiting for MASTER_ADDR=mlm-master-0 to resolve (attempt 1" in logged[0]
    assert "resolves now" in logged[-1]


def test_a_name_that_resolves_at_once_is_not_logged():
    logged = []
    assert rendezvous.wait_for_address("m", "MASTER_ADDR", 60, logged.append, rendezvous.Lookup(lambda host: None)) == 0
    assert logged == []


def test_wait_for_address_is_bounded():
    now = [0.0]
    slept = []

    def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds

    with pytest.raises(UserError, match=r"MASTER_ADDR='nowhere' did not resolve within 30s") as caught:
        rendezvous.wait_for_address(
            "nowhere", "MASTER_ADDR", 30, lambda m: None, rendezvous.Lookup(unresolvable, sleep, lambda: now[0]), {}
        )
    assert caught.value.exit_code == 1  # retried by the Job controller, unlike exit 3
    assert now[0] == 30
    assert slept == [1.0, 2.0, 4.0, 8.0, 10.0, 5.0]  # doubling up to 10 s, the last wait cut to the deadline
    assert "(or raise MLM_RDZV_TIMEOUT)" in str(caught.value)


def test_the_wait_for_slurms_master_names_the_fix():
    never = rendezvous.Lookup(unresolvable, lambda s: None)
    with pytest.raises(UserError, match="Slurm's name for node 0 must resolve on every node") as caught:
        rendezvous.wait_for_address("gpu07", "SLURM_STEP_NODELIST", 0, lambda m: None, never)
    assert caught.value.exit_code == 1


@pytest.mark.parametrize(
    ("source", "environ", "hint"),
    [
        ("SLURM_STEP_NODELIST", {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, "Slurm's name for node 0"),
        ("PET_MASTER_ADDR", {}, "Kubernetes: check that pod 0"),
        ("MASTER_ADDR", {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, "Kubernetes: check that pod 0"),
        ("MASTER_ADDR", {}, "set MASTER_ADDR to node 0's host name or IP address"),
        ("PET_RDZV_ENDPOINT", {}, "Kubernetes: check that pod 0"),
    ],
)
def test_resolve_hint_follows_where_the_name_came_from(source, environ, hint):
    assert rendezvous.resolve_hint(source, environ).startswith(hint)
