"""Supply chain: the vulnerability audit of the locks, the image's SBOM, the locks' Python, Renovate's config."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.conftest import REPO
from tools import audit, sbom

TODAY = dt.date(2026, 12, 1)
# The Python of each distribution release the images and machines use; a new base needs its line here.
UBUNTU_PYTHON = {"22.04": "3.10", "24.04": "3.12"}
DEBIAN_PYTHON = {"bookworm": ("12", "3.11"), "trixie": ("13", "3.13")}


def read(path: str) -> str:
    return (REPO / path).read_text(encoding="utf-8")


def lock_pin(name: str, lock: str = "requirements.lock") -> str:
    return re.search(rf"^{name}==(\S+)", read(lock), re.M)[1]


def dockerfile_base() -> str:
    return re.search(r"^ARG BASE_IMAGE=(\S+)$", read("docker/Dockerfile"), re.M)[1]


# --- the audit's ignore file -------------------------------------------------------------------------------------


def write_ignores(tmp_path: Path, *entries: str) -> Path:
    path = tmp_path / "audit-ignore.toml"
    path.write_text("".join(f"[[ignore]]\n{entry}\n" for entry in entries), encoding="utf-8")
    return path


GOOD = 'id = "GHSA-aaaa-bbbb-cccc"\npackage = "six"\nreason = "only its py2 shim; never imported"\nuntil = 2027-03-01'


def test_the_committed_ignore_file_is_valid():
    for ignore in audit.load_ignores(REPO / audit.IGNORE_FILE, dt.datetime.now(dt.UTC).date()):
        assert ignore.reason and ignore.until


def test_a_complete_entry_loads(tmp_path):
    (ignore,) = audit.load_ignores(write_ignores(tmp_path, GOOD), TODAY)
    assert ignore == audit.Ignore(
        "GHSA-aaaa-bbbb-cccc", "six", "only its py2 shim; never imported", dt.date(2027, 3, 1)
    )


@pytest.mark.parametrize(
    ("entry", "error"),
    [
        (
            GOOD.replace('reason = "only its py2 shim; never imported"\n', ""),
            r"entry 2 \(GHSA-aaaa-bbbb-cccc\): no reason",
        ),
        (GOOD.replace('"only its py2 shim; never imported"', '"  "'), r"no reason"),
        (GOOD.replace("\nuntil = 2027-03-01", ""), r"no until \(the date"),
        (GOOD.replace("2027-03-01", '"next spring"'), r"until = 'next spring' is not a date"),
        (GOOD.replace("2027-03-01", "2026-11-30"), r"expired on 2026-11-30: look at it again"),
        (GOOD.replace("2027-03-01", "2030-01-01"), r"more than 366 days away"),
        (GOOD.replace('package = "six"\n', ""), r"no package"),
        (GOOD + '\nseverity = "low"', r"unknown key 'severity'"),
    ],
    ids=["no-reason", "blank-reason", "no-until", "not-a-date", "expired", "too-far", "no-package", "unknown-key"],
)
def test_an_incomplete_or_expired_entry_is_an_error(tmp_path, entry, error):
    with pytest.raises(audit.AuditError, match=error):
        audit.load_ignores(write_ignores(tmp_path, GOOD, entry), TODAY)


def test_an_expired_entry_fails_the_run_even_offline(tmp_path, capsys):
    ignores = write_ignores(tmp_path, GOOD.replace("2027-03-01", "2026-11-30"))
    closed = "http://127.0.0.1:9/v1/query"  # nothing listens: the audit itself would be skipped
    code = audit.main(
        ["--service", "osv", "--osv-url", closed, "--ignore-file", str(ignores), read_lock(tmp_path)], TODAY
    )
    assert code == 1
    assert "audit: FAILED" in capsys.readouterr().out


# --- the audit against a vulnerability service on loopback (pip-audit's OSV client) -------------------------------


class FakeOsv(BaseHTTPRequestHandler):
    """OSV's /v1/query: one advisory against six (any version), nothing else."""

    def do_POST(self):  # noqa: N802
        query = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        body = {}
        if query["package"]["name"] == "six":
            affected = [
                {
                    "package": {"name": "six", "ecosystem": "PyPI"},
                    "ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "0"}, {"fixed": "9.0"}]}],
                }
            ]
            body = {
                "vulns": [
                    {
                        "id": "GHSA-aaaa-bbbb-cccc",
                        "aliases": ["CVE-2099-0001"],
                        "summary": "a test advisory",
                        "affected": affected,
                    }
                ]
            }
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


class NotFound(FakeOsv):
    """A proxy that serves PyPI's index but answers 404 for /pypi/NAME/VERSION/json (this project's machines)."""

    def do_GET(self):  # noqa: N802
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture
def server():
    servers = []

    def start(handler: type[BaseHTTPRequestHandler]) -> str:
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}"

    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


def read_lock(tmp_path: Path) -> str:
    """A two-package lock as pip-compile writes it (the hashes are never checked: nothing is downloaded)."""
    lock = tmp_path / "requirements.lock"
    lock.write_text(
        f"six==1.16.0 \\\n    --hash=sha256:{'a' * 64}\n    # via -r requirements.in\n"
        f"idna==3.7 \\\n    --hash=sha256:{'b' * 64}\n",
        encoding="utf-8",
    )
    return str(lock)


def test_a_known_vulnerability_fails_the_audit(tmp_path, server, capsys):
    url = server(FakeOsv) + "/v1/query"
    args = ["--service", "osv", "--osv-url", url, "--ignore-file", str(tmp_path / "none.toml"), read_lock(tmp_path)]
    assert audit.main(args, TODAY) == 1
    out = capsys.readouterr().out
    assert "audit: VULNERABLE: six==1.16.0 (requirements.lock): " in out
    assert "GHSA-aaaa-bbbb-cccc" in out and "fixed in 9.0" in out
    assert out.splitlines()[-1].startswith("audit: FAILED: 1 known vulnerability not in none.toml")


def test_an_ignore_entry_accepts_it_by_any_alias(tmp_path, server, capsys):
    url = server(FakeOsv) + "/v1/query"
    ignores = write_ignores(tmp_path, GOOD.replace("GHSA-aaaa-bbbb-cccc", "cve-2099-0001"))
    assert (
        audit.main(["--service", "osv", "--osv-url", url, "--ignore-file", str(ignores), read_lock(tmp_path)], TODAY)
        == 0
    )
    out = capsys.readouterr().out
    assert "audit: accepted until 2027-03-01 (audit-ignore.toml): six==1.16.0" in out
    assert "reason: only its py2 shim; never imported" in out
    assert out.splitlines()[-1] == (
        "audit: ok: 2 packages in requirements.lock (osv), no known vulnerability but the 1 accepted in audit-ignore.toml"
    )


def test_no_network_is_one_skipped_line_and_strict_fails(tmp_path, capsys):
    args = ["--service", "osv", "--osv-url", "http://127.0.0.1:9/v1/query", "--ignore-file", str(tmp_path / "none")]
    args.append(read_lock(tmp_path))
    assert audit.main(args, TODAY) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("audit: SKIPPED, nothing audited: cannot reach http://127.0.0.1:9/v1/query: ")
    assert audit.main([*args, "--strict"], TODAY) == 1
    assert capsys.readouterr().out.startswith("audit: FAILED (--strict): cannot reach")


def test_pypi_without_its_json_api_is_a_skip_not_a_clean_audit(tmp_path, server, monkeypatch, capsys):
    # pip-audit alone reports every package "not found on PyPI", says "No known vulnerabilities found" and exits 0.
    monkeypatch.setattr(audit, "PYPI_PROBE", server(NotFound) + "/pypi/pip/24.0/json")
    args = ["--ignore-file", str(tmp_path / "none"), read_lock(tmp_path)]
    assert audit.main(args, TODAY) == 0
    assert "audit: SKIPPED, nothing audited: " in capsys.readouterr().out
    skipped = {"dependencies": [{"name": "six", "skip_reason": "Dependency not found on PyPI"}]}
    monkeypatch.setattr(audit, "probe", lambda *args: None)
    monkeypatch.setattr(audit, "run_pip_audit", lambda *args: skipped)
    assert audit.main(args, TODAY) == 0
    assert "the service answered for none of the 1 packages" in capsys.readouterr().out


def test_make_test_runs_the_audit_of_every_lock():
    assert re.search(r"^test: .*\baudit\b", read("Makefile"), re.M)
    assert audit.LOCKS == ("requirements.lock", "requirements-cuda.lock", "requirements-dev.lock")
    for lock in ("requirements.lock", "requirements-dev.lock"):  # requirements-cuda.lock may be empty
        assert audit.pins(REPO / lock), lock  # pip-audit --disable-pip --require-hashes reads the same lines


# --- which Python the locks are for ------------------------------------------------------------------------------


def lock_notes() -> dict[str, list[str]]:
    """What `make lock` writes above pip-compile's header: the text of its `sed -i '1i ...' LOCK` lines."""
    recipe = subprocess.run(["make", "-n", "lock"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return {m[2]: m[1].split("\\n") for m in re.finditer(r"^sed -i '1i (.*)' (\S+)$", recipe, re.M)}


def test_the_locks_say_which_python_they_are_resolved_with_and_why():
    notes = lock_notes()
    assert set(notes) == {"requirements.lock", "requirements-dev.lock"}
    for lock, note in notes.items():
        lines = read(lock).splitlines()
        assert lines[: len(note)] == note, f"{lock} does not start with what `make lock` writes"
        stated = re.match(
            r"# Resolved with Python (\d+\.\d+) \(Debian (\d+), the development and CI machines\)", note[0]
        )
        compiled = re.search(r"^# This file is autogenerated by pip-compile with Python (\d+\.\d+)$", read(lock), re.M)
        assert stated and compiled and stated[1] == compiled[1], (note[0], compiled and compiled[0])
        # The CI image test's base is the same Debian release, whose Python the wheelhouse is downloaded for.
        suite = re.search(r"debootstrap --variant=minbase (\w+) ", read("docker/image-test.sh"))[1]
        assert DEBIAN_PYTHON[suite] == (stated[2], stated[1]), (suite, stated[0])


def test_the_image_python_the_lock_names_is_the_base_images():
    note = lock_notes()["requirements.lock"][0]
    image_python, ubuntu = re.search(r"the image runs Python (\d+\.\d+) \(Ubuntu (\d+\.\d+)\)", note).groups()
    assert f"-ubuntu{ubuntu}@" in dockerfile_base()
    assert UBUNTU_PYTHON[ubuntu] == image_python
    assert f"(Python {image_python}, " in read("requirements-cuda.lock").splitlines()[0]
    assert f'"--python-version", default="{image_python}"' in read("docker/lock_cuda.py")
    assert f"({image_python} on Ubuntu {ubuntu}, " in read("docker/Dockerfile")


# --- Renovate ----------------------------------------------------------------------------------------------------


def renovate() -> dict:
    return json.loads(read("renovate.json"))


def files_matching(patterns: list[str]) -> list[Path]:
    regexes = [re.compile(p.strip("/")) for p in patterns]
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    return [REPO / f for f in tracked if any(r.search(f) for r in regexes)]


def renovate_matches() -> list[tuple[dict, Path, re.Match]]:
    found = []
    for manager in renovate()["customManagers"]:
        for path in files_matching(manager["managerFilePatterns"]):
            for pattern in manager["matchStrings"]:
                # Renovate's named groups are JavaScript's (?<name>...)
                found += [(manager, path, m) for m in re.finditer(pattern.replace("(?<", "(?P<"), path.read_text())]
    return found


def test_renovate_reads_the_base_image_tag_and_digest_from_the_dockerfile():
    (base,) = [m for manager, _, m in renovate_matches() if manager["datasourceTemplate"] == "docker"]
    assert f"{base['depName']}:{base['currentValue']}@{base['currentDigest']}" == dockerfile_base()
    assert base["currentValue"].endswith("-ubuntu24.04")


def test_renovate_bumps_every_copy_of_the_torch_stack_pins():
    seen = {}
    for manager, path, m in renovate_matches():
        if manager["datasourceTemplate"] == "pypi":
            name = manager.get("depNameTemplate", "").replace(
                "{{{lowercase depName}}}", m.groupdict().get("depName", "").lower()
            )
            seen[(path.name, name)] = m["currentValue"]
    for name in ("torch", "transformers", "datasets", "accelerate"):
        assert seen[("Dockerfile", name)] == lock_pin(name), name
    pinned = {m[1] for m in re.finditer(r"^([a-z][\w-]*)==", read("requirements.in"), re.M)}
    assert {"torch", "transformers", "datasets", "accelerate"} <= pinned  # pip_requirements bumps these


def test_renovate_groups_it_all_and_regenerates_the_locks():
    config = renovate()
    assert set(config["enabledManagers"]) == {"pip_requirements", "custom.regex"}
    assert {p.name for p in files_matching(config["pip_requirements"]["managerFilePatterns"])} == {
        "requirements.in",
        "requirements-dev.in",
    }
    (group,) = [rule for rule in config["packageRules"] if "groupName" in rule]
    assert set(group["matchManagers"]) == set(config["enabledManagers"])
    assert group["postUpgradeTasks"]["commands"][-1].endswith("make lock")
    assert set(group["postUpgradeTasks"]["fileFilters"]) == set(audit.LOCKS)


# --- the SBOM ----------------------------------------------------------------------------------------------------


def test_build_sh_takes_the_base_from_the_dockerfile_unless_told(monkeypatch):
    def base_image(env: dict) -> str:
        command = ["bash", "-c", "source docker/build.sh && base_image"]
        return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=True).stdout.strip()

    monkeypatch.delenv("BASE_IMAGE", raising=False)
    assert base_image(dict(os.environ)) == dockerfile_base()
    assert base_image({**os.environ, "BASE_IMAGE": "localhost/base:12"}) == "localhost/base:12"


def test_the_sbom_is_valid_cyclonedx_with_the_locked_torch_and_the_base_digest():
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    # As docker/build.sh runs it inside the image: the script on stdin of the environment's own interpreter.
    args = ["--image", "mlm-trainer:dev", "--base-image", dockerfile_base(), "--created", "2026-12-01T00:00:00Z"]
    done = subprocess.run(
        [sys.executable, "-", *args],
        stdin=(REPO / "tools" / "sbom.py").open(),
        capture_output=True,
        text=True,
        check=True,
    )
    validator = JsonStrictValidator(SchemaVersion.V1_6)
    assert validator.validate_str(done.stdout) is None
    assert validator.validate_str(done.stdout.replace('"bomFormat"', '"bomformat"')) is not None  # it does check

    bom = json.loads(done.stdout)
    libraries = {c["name"].lower(): c for c in bom["components"] if c["type"] == "library"}
    assert libraries["torch"]["version"].split("+")[0] == lock_pin("torch")
    assert libraries["torch"]["purl"].startswith(f"pkg:pypi/torch@{lock_pin('torch')}")
    refs = [c["bom-ref"] for c in bom["components"]]
    assert len(refs) == len(set(refs))
    (base,) = [c for c in bom["components"] if c["bom-ref"] == "base-image"]
    digest = dockerfile_base().split("@sha256:")[1]
    assert (base["name"], base["hashes"]) == ("docker.io/nvidia/cuda", [{"alg": "SHA-256", "content": digest}])
    assert base["purl"] == f"pkg:oci/cuda@sha256%3A{digest}?repository_url=docker.io/nvidia/cuda&tag={base['version']}"
    properties = {p["name"]: p["value"] for p in bom["metadata"]["properties"]}
    assert properties["mlm-trainer:base-image"] == dockerfile_base()


def test_a_local_base_without_a_digest_is_named_by_its_image_id():
    base = sbom.base_component("localhost/mlm-trainer-base:bookworm", "sha256:" + "c" * 64)
    assert (base["name"], base["version"]) == ("localhost/mlm-trainer-base", "bookworm")
    assert "hashes" not in base and "purl" not in base
    assert base["properties"] == [{"name": "mlm-trainer:local-image-id", "value": "sha256:" + "c" * 64}]
    hub = sbom.base_component("debian:12@sha256:" + "d" * 64, "")
    assert hub["purl"] == f"pkg:oci/debian@sha256%3A{'d' * 64}?repository_url=docker.io/library/debian&tag=12"


@pytest.mark.parametrize("lock", ["requirements.lock", "requirements-dev.lock", "requirements-cuda.lock"])
def test_every_pin_is_a_release_plain_pypi_has(lock):
    """A local version label (``torch==2.13.0+cpu``) names a file on another index or on one machine's disk: on a
    laptop with plain PyPI, `make venv` failed with "No matching distribution found"."""
    labelled = re.findall(r"^([A-Za-z0-9._-]+==\S*\+\S*)", read(lock), re.M)
    assert labelled == [], f"{lock} pins builds PyPI does not serve: {labelled}"


def test_ci_installs_as_a_user_with_plain_pypi_would():
    """.ci/run drops the machine's pip settings (local wheel folders, local indexes, a version cap), so CI's
    `make venv` is the front door a user's machine takes."""
    text = read(".ci/run")
    assert "export PIP_CONFIG_FILE=/dev/null" in text
    assert re.search(r"^unset .*PIP_FIND_LINKS", text, re.M)
    assert text.index("PIP_CONFIG_FILE=/dev/null") < text.index("make test")


def test_the_base_image_is_named_with_its_registry() -> None:
    """A default podman refuses a short name it has no alias for ("short-name ... did not resolve to an alias"):
    the Dockerfile names its base with the registry, as every engine resolves it."""
    registry = dockerfile_base().split("/", 1)[0]
    assert "." in registry or registry == "localhost", dockerfile_base()
