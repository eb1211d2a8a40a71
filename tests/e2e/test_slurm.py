"""Slurm for real: slurm/train.sbatch submitted with ``sbatch --nodes=2`` to a two-node cluster on this machine
(tests/e2e/slurm_cluster.py), through srun, entrypoint.sh, the launcher and torchrun (gloo on CPU).

One job carries the whole story, to stay inside a few minutes on two cores: it trains across both nodes, is stopped by
``scancel --signal=TERM`` after a checkpoint (every process of the step gets the signal, as on a real cluster), exits
75, is requeued by its script, and its second run resumes on both nodes to one final/ with world size 2. Slurm holds
a requeued job for AuthInfo's cred_expire (120 s by default); the test cluster sets 10 s. (Starting it earlier with
``scontrol update StartTime=now`` fails it at launch, "Job credential revoked", when it lands on the same nodes.)
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.conftest import REPO, tiny_env
from tests.e2e.runs import last_rate, records
from tests.e2e.slurm_cluster import Cluster, Job, slurm_cluster

pytestmark = [pytest.mark.slow, pytest.mark.alone]  # timed or to a deadline: not beside other runs

SCRIPT = REPO / "slurm" / "train.sbatch"
# 1,600 demo samples (1,280 to train) in batches of 16 on 2 ranks: 40 steps, a checkpoint every 10, no workers.
RESUMABLE = {"demo_samples": "1600", "per_device_train_batch_size": "16", "save_strategy": "steps", "save_steps": "10"}
RUN_TIMEOUT_S = 240  # one run of the job, start to end, on 2 busy cores
# A budgeted job: far more steps than fit in its minute (500 epochs of 400 samples in batches of 8), evaluated
# and saved every 10 steps.
LIMIT_MIN = 1  # Slurm's smallest limit
BUDGETED = {
    "num_train_epochs": "500", "per_device_train_batch_size": "8", "eval_strategy": "steps", "eval_steps": "10",
    "save_strategy": "steps", "save_steps": "10", "logging_steps": "1", "warmup_steps": "5",
}  # fmt: skip
FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as running:
        yield running


def read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


@pytest.mark.waits  # on Slurm's scheduling: it runs beside the unit tests (make test)
def test_two_nodes_train_are_stopped_requeued_and_resume_to_one_final(cluster: Cluster, tmp_path: Path) -> None:
    output = tmp_path / "output"
    env = tiny_env(output, log_format="text", logging_steps="10", **RESUMABLE)
    env["HF_HOME"] = str(tmp_path / "hf")  # one cache on a filesystem both nodes see, as on a cluster
    log = tmp_path / "job.out"
    job_id = cluster.sbatch("--nodes=2", f"--output={log}", "--time=10", str(SCRIPT), env=env)
    port = 61000 + int(job_id) % 4536

    # Stop it once a checkpoint is whole: every process of the step gets SIGTERM, as scancel sends it.
    checkpoint = output / "checkpoint-10" / ".complete"
    cluster.wait(job_id, lambda job: checkpoint.exists() or job.state in FINISHED, "at checkpoint-10", RUN_TIMEOUT_S)
    assert checkpoint.exists(), f"job ended before checkpoint-10:\n{read(log)[-4000:]}"
    signalled = cluster.client("scancel", "--signal=TERM", job_id)
    assert signalled.returncode == 0, signalled.stderr

    # The ranks save and exit 75; the script requeues the job.
    def requeued_or_ended(job: Job) -> bool:
        return (job.restarts >= 1 and job.state == "PENDING") or job.state in FINISHED

    requeued = cluster.wait(job_id, requeued_or_ended, "requeued", 120)
    first_run = read(log)
    assert (requeued.restarts, requeued.state) == (1, "PENDING"), first_run[-4000:]
    assert first_run.count("Exited with exit code 75") == 2, first_run[-4000:]  # srun, for each node
    assert "mlm-trainer: preempted (exit 75), a checkpoint is saved: requeueing job" in first_run, first_run[-4000:]
    stopped = re.search(r"stopped by SIGTERM at step (\d+); checkpoint saved", first_run)
    assert stopped, first_run[-4000:]
    assert "Traceback" not in first_run, first_run[-4000:]
    # The one HF_HOME: node 0 prepares the data, node 1 reads it (tests/e2e/test_multinode.py has both cases).
    assert "is node 0's too (a shared volume): node 0 prepares the data, this node reads it" in first_run
    assert not (output / "final").exists()

    done = cluster.wait(job_id, lambda job: job.state in FINISHED, "finished", RUN_TIMEOUT_S)
    whole = read(log)
    second_run = whole[len(first_run) :]
    assert (done.state, done.exit_code, done.restarts) == ("COMPLETED", "0:0", 1), whole[-4000:]
    assert f"job {job_id} on mlmnode[1-2], run 2" in second_run
    assert f"resuming from {output}/checkpoint-{stopped[1]}\n" in second_run, second_run[-4000:]

    # Both runs: two nodes, one rank each, meeting at Slurm's first node on the job's port.
    for run in (first_run, second_run):
        assert "batch: 16 per device x 1 process x 2 nodes x 1 accumulation = 32 global" in run, run[-4000:]
        assert f"--node-rank 1 --master-addr mlmnode1 --master-port {port} --rdzv-id {job_id}" in run, run[-4000:]
    assert sorted(p.name for p in output.iterdir() if p.name.startswith("final")) == ["final"]
    assert (output / "final" / "model.safetensors").exists()
    facts = json.loads((output / "run.json").read_text())
    assert (facts["status"], facts["world_size"], facts["hardware"]["nnodes"]) == ("finished", 2, "2")
    assert facts["command"][facts["command"].index("--master-addr") + 1] == "mlmnode1"


@pytest.mark.waits
def test_plan_in_a_step_reads_slurm_and_the_batch_script_is_told_to_use_srun(cluster: Cluster, tmp_path: Path) -> None:
    """What Slurm really sets: ``plan`` in each task of ``srun --nodes=2 --ntasks-per-node=1``, and in the batch
    script of the same 2-node job (refused, exit 2); ``time_budget: slurm`` is the job's end time, asked of the
    controller."""
    log, entrypoint = tmp_path / "job.out", REPO / "entrypoint.sh"
    script = (
        f"{entrypoint} plan; echo batch script: exit $?; "
        f"srun --ntasks-per-node=1 --output={tmp_path}/plan-%t.json {entrypoint} plan"
    )
    env = tiny_env(tmp_path / "output", time_budget="slurm")
    job_id = cluster.sbatch("--nodes=2", "--time=7", f"--output={log}", f"--wrap={script}", env=env)
    done = cluster.wait(job_id, lambda job: job.state in FINISHED, "finished", 120)
    assert (done.state, done.exit_code) == ("COMPLETED", "0:0"), read(log)
    assert "SLURM_JOB_NUM_NODES=2 but this is the job's batch script, not a job step" in read(log)
    assert "batch script: exit 2" in read(log)
    port = 61000 + int(job_id) % 4536
    for rank in (0, 1):
        plan = json.loads((tmp_path / f"plan-{rank}.json").read_text())
        assert (plan["nnodes"], plan["node_rank"], plan["world_size"]) == (2, rank, 2)
        assert plan["rendezvous"] == {
            "mode": "static",
            "master_addr": "mlmnode1",
            "master_port": port,
            "backend": None,
            "endpoint": None,
            "id": job_id,
        }
        assert plan["topology_sources"] == {
            "nnodes": "SLURM_STEP_NUM_NODES",
            "node_rank": "SLURM_NODEID",
            "master_addr": "SLURM_STEP_NODELIST",
            "master_port": "SLURM_JOB_ID",
            "rdzv_id": "SLURM_JOB_ID",
        }
        # Its limit's end: the start plus --time (EndTime, once the job is over, is when it ended).
        end = (datetime.fromisoformat(done.fields["StartTime"]) + timedelta(minutes=7)).astimezone(UTC)
        assert plan["deadline"]["source"] == f"MLM_TIME_BUDGET=slurm: the Slurm job {job_id}'s end time", plan
        assert plan["deadline"]["at"] == end.strftime("%Y-%m-%d %H:%M:%S UTC"), (plan["deadline"], end)
        assert plan["deadline"]["budget"].startswith(("6m", "7m")), plan["deadline"]


# Not -m waits: it plans to a deadline, so it runs with the other end-to-end tests on an otherwise idle machine (beside
# the unit tests and the image build its start-up alone took it past Slurm's one minute: issue 51's budget on a
# loaded machine).
def test_a_job_with_a_time_limit_and_the_slurm_budget_ends_decayed_with_final_before_its_limit(
    cluster: Cluster, tmp_path: Path
) -> None:
    """``time_budget: slurm`` under ``sbatch --time=1``: far more steps than fit, planned to the job's end time as
    the controller states it; the job ends COMPLETED before Slurm's limit with final/ written and evaluated and the
    learning rate decayed with its last step. (No ``--signal``: Slurm may send it up to a minute early.)"""
    output, log = tmp_path / "output", tmp_path / "job.out"
    env = tiny_env(output, time_budget="slurm", log_format="text", **BUDGETED)
    env["HF_HOME"] = str(tmp_path / "hf")
    script = f"srun --ntasks-per-node=1 {REPO / 'entrypoint.sh'} train"
    job_id = cluster.sbatch("--nodes=1", f"--time={LIMIT_MIN}", f"--output={log}", f"--wrap={script}", env=env)
    done = cluster.wait(job_id, lambda job: job.state in FINISHED, "finished", LIMIT_MIN * 60 + 90)
    assert (done.state, done.exit_code) == ("COMPLETED", "0:0"), read(log)[-4000:]
    took = datetime.fromisoformat(done.fields["EndTime"]) - datetime.fromisoformat(done.fields["StartTime"])
    assert took < timedelta(minutes=LIMIT_MIN), took

    run = json.loads((output / "run.json").read_text())
    budget = run["time_budget"]
    assert (run["status"], budget["source"]) == (
        "finished",
        f"MLM_TIME_BUDGET=slurm: the Slurm job {job_id}'s end time",
    )
    # The minute, less the launch; up to 2 s more: the controller's times are whole seconds, and the launcher's start
    # (psutil: the kernel's boot time in whole seconds plus the start ticks) may be a second off.
    assert re.fullmatch(r"1m([12]s)?|[3-5]\ds", budget["budget"]), budget
    total = budget["planned_steps"]
    assert budget["steps_set_by_options"] > total > 10, budget  # set by the time, not by the epochs
    trained = [r for r in records(output / "logs" / "train.jsonl") if r.get("event") == "train" and "loss" in r]
    assert trained[-1]["step"] == total and trained[-1]["learning_rate"] == pytest.approx(last_rate(run)), trained[-1]
    assert run["quality_curve"][-1]["step"] == total
    assert json.loads((output / "all_results.json").read_text())["eval_loss"] > 0
    assert (output / "final" / "model.safetensors").exists()
