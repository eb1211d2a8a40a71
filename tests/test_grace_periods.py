"""The stop chain: each manifest's grace period > MLM_STOP_TIMEOUT (torchrun's --shutdown-timeout) > a save."""

from __future__ import annotations

import re

import yaml

from tests.conftest import REPO
from train.config import LaunchArguments

LAUNCHER_MARGIN_S = 30  # the launcher relays the ranks' exit after torchrun: a few seconds, 30 to spare


def pod_stop_timeout(pod: dict) -> int:
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}
    return int(env.get("MLM_STOP_TIMEOUT") or LaunchArguments.stop_timeout)


def test_kubernetes_grace_period_covers_the_stop_timeout():
    pod = yaml.safe_load((REPO / "k8s" / "base" / "pod-template.yaml").read_text())["template"]
    assert pod["spec"]["terminationGracePeriodSeconds"] >= pod_stop_timeout(pod) + LAUNCHER_MARGIN_S
    assert pod_stop_timeout(pod) == LaunchArguments.stop_timeout  # the default, stated where the grace period is


def test_compose_grace_period_covers_the_stop_timeout():
    service = yaml.safe_load((REPO / "compose.yaml").read_text())["x-train"]
    seconds = int(re.fullmatch(r"(\d+)s", service["stop_grace_period"]).group(1))
    assert seconds >= LaunchArguments.stop_timeout + LAUNCHER_MARGIN_S
