"""Activation checkpointing (the Trainer's ``gradient_checkpointing``) under MLM_SHARDING=fsdp: transformers 5.25
checkpoints a layer's ``forward`` inside FSDP2's hooks (``GradientCheckpointingLayer``), so the backward pass
recomputes each sharded layer and the gradients are the same as without it. One gloo rank in a child process (a
process group in the test process would outlive the test)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO

PROGRAM = """
import json, os, socket, torch, torch.distributed as dist
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo")
from torch.distributed.tensor import DTensor
from transformers import DistilBertConfig, DistilBertForMaskedLM
from train.run.sharding import shard_model

def gradients(checkpointing):
    torch.manual_seed(0)
    config = DistilBertConfig(n_layers=2, dim=64, hidden_dim=128, n_heads=2, vocab_size=100)
    model = shard_model(DistilBertForMaskedLM(config), "cpu")
    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable()
    runs = []
    for layer in model.distilbert.transformer.layer:
        layer.attention.register_forward_hook(lambda *args: runs.append(1))
    ids = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(1))
    model(input_ids=ids, labels=ids).loss.backward()
    local = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in model.parameters()]
    return len(runs), local

plain_runs, plain = gradients(False)
checkpointed_runs, checkpointed = gradients(True)
print(json.dumps({"runs": [plain_runs, checkpointed_runs],
                  "equal": all(torch.equal(a, b) for a, b in zip(plain, checkpointed))}))
"""


def test_fsdp_layers_are_recomputed_in_the_backward_pass_with_the_same_gradients() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["runs"] == [2, 4]  # each layer's attention: once, then once more in the backward pass
    assert result["equal"]
