"""What an output_dir in a store costs: ``python -m bench.store [--sizes-mib 256,1024] [--repeats 3]``.

Against moto's S3-compatible server on loopback (the one the tests use; a real store's bandwidth and latency
differ, so these are the job's own overheads plus loopback HTTP, a lower bound): the seconds per GiB to upload a
checkpoint with train/outputs/store.py (marker last, every file one PUT or a multipart upload) and to download it,
min-max over repeats; then a demo run of the job to a bucket, whose per-save upload lines ("uploaded checkpoint-N ... in
X s") give the extra seconds each save costs. Writes bench/results/<date>-vm-store.{json,md} and latest-store.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import date
from pathlib import Path
from typing import Any

from bench.runner import run_entrypoint, write_results
from train.outputs.store import Store

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
MIB = 2**20
UPLOADED = re.compile(r"uploaded (checkpoint-\d+) to \S+ \(([\d,.]+) MiB in ([\d.]+) s\)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_moto(log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    server = Path(sys.executable).with_name("moto_server")
    process = subprocess.Popen([str(server), "-H", "127.0.0.1", "-p", str(port)], stdout=log.open("wb"), stderr=-2)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(url, timeout=1)  # noqa: S310 - loopback
            return process, url
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"moto_server did not start; see {log}")


def fake_checkpoint(root: Path, step: int, mib: int) -> Path:
    """A checkpoint of ``mib`` MiB of incompressible bytes: a third weights, two thirds optimizer (Adam keeps two
    moments per weight), and the small files the Trainer writes beside them."""
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    for name, share in (("model.safetensors", 1 / 3), ("optimizer.pt", 2 / 3)):
        with (path / name).open("wb") as handle:
            for _ in range(round(mib * share)):
                handle.write(os.urandom(MIB))
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (path / "rng_state.pth").write_bytes(os.urandom(16_000))
    return path


def raw_transfers(url: str, sizes: list[int], repeats: int, work: Path) -> list[dict[str, Any]]:
    rows = []
    for mib in sizes:
        local = fake_checkpoint(work / f"up-{mib}", 1, mib)
        ups, downs = [], []
        for repeat in range(repeats):
            store = Store(f"s3://bench/raw-{mib}-{repeat}")
            started = time.perf_counter()
            store.upload_checkpoint(local)
            ups.append(time.perf_counter() - started)
            target = work / f"down-{mib}-{repeat}"
            target.mkdir()
            started = time.perf_counter()
            store.download_checkpoint(1, target)
            downs.append(time.perf_counter() - started)
            shutil.rmtree(target)
            store.remove("checkpoint-1")
        shutil.rmtree(local.parent)
        gib = mib / 1024
        rows.append(
            {
                "mib": mib,
                "upload_s": ups,
                "download_s": downs,
                "upload_s_per_gib": [min(ups) / gib, max(ups) / gib],
                "download_s_per_gib": [min(downs) / gib, max(downs) / gib],
            }
        )
        print(f"{mib} MiB: upload {min(ups):.2f}-{max(ups):.2f} s, download {min(downs):.2f}-{max(downs):.2f} s")
    return rows


def job_saves(work: Path) -> dict[str, Any]:
    """The demo preset (a small model) to a bucket, a checkpoint every 10 steps: each save's upload line."""
    done, wall = run_entrypoint(
        work,
        config=str(REPO / "configs" / "demo.yaml"),
        demo_samples="640",
        per_device_train_batch_size="16",
        save_strategy="steps",
        save_steps="10",
        dataloader_num_workers="0",
        log_format="text",
        output_dir="s3://bench/job",
        staging_dir=str(work / "staging"),
    )
    saves = [
        {"checkpoint": name, "mib": float(mib.replace(",", "")), "seconds": float(s)}
        for name, mib, s in UPLOADED.findall(done.stderr)
    ]
    return {"wall_s": wall, "saves": saves}


def markdown(document: dict[str, Any]) -> str:
    lines = [
        f"# Outputs in a store: what they cost ({document['date']}, {document['machine']})",
        "",
        "moto's S3-compatible server on loopback (a lower bound for a real store: its bandwidth and latency are",
        "not loopback's); min-max over repeats. Command: `" + document["command"] + "`",
        "",
        "| checkpoint | upload | download | upload per GiB | download per GiB |",
        "|---|---|---|---|---|",
    ]
    for row in document["raw"]:
        up, down = row["upload_s_per_gib"], row["download_s_per_gib"]
        lines.append(
            f"| {row['mib']} MiB | {min(row['upload_s']):.2f}-{max(row['upload_s']):.2f} s | "
            f"{min(row['download_s']):.2f}-{max(row['download_s']):.2f} s | {up[0]:.1f}-{up[1]:.1f} s | "
            f"{down[0]:.1f}-{down[1]:.1f} s |"
        )
    saves = document["job"]["saves"]
    if saves:
        seconds = [save["seconds"] for save in saves]
        lines += [
            "",
            f"The demo preset to a bucket: {len(saves)} saves of {saves[0]['mib']:.1f} MiB, each adding "
            f'{min(seconds):.2f}-{max(seconds):.2f} s (the job\'s own "uploaded checkpoint-N" lines); '
            f"the whole run {document['job']['wall_s']:.1f} s.",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mib", default="256,1024", help="checkpoint sizes to transfer, MiB")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(RESULTS), help="where the results go")
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.sizes_mib.split(",")]
    if args.repeats < 1 or any(size < 1 for size in sizes):
        parser.error("--repeats and every size must be at least 1")
    with tempfile.TemporaryDirectory(prefix="bench-store-") as scratch:
        work = Path(scratch)
        process, url = start_moto(work / "moto.log")
        os.environ.update(
            AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
            AWS_ENDPOINT_URL=url, AWS_EC2_METADATA_DISABLED="true",
        )  # fmt: skip
        try:
            import s3fs

            s3fs.S3FileSystem(skip_instance_cache=True).mkdir("bench")
            raw = raw_transfers(url, sizes, args.repeats, work)
            job = job_saves(work)
        finally:
            process.terminate()
            process.wait(timeout=30)
    today = date.today().isoformat()
    document = {
        "date": today,
        "machine": f"{os.cpu_count()} CPUs, loopback",
        "command": "python -m bench.store " + " ".join(argv if argv is not None else sys.argv[1:]),
        "raw": raw,
        "job": job,
    }
    text = markdown(document)
    write_results(Path(args.out), f"{today}-vm-store", document, text, "latest-store.md")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
