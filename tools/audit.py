"""Known vulnerabilities in the locks: pip-audit of the lock files as written, against PyPI's vulnerability data.

`make audit` (and `make test`) runs it on requirements.lock and requirements-cuda.lock (what the image installs)
and requirements-dev.lock (the tools the tests run, servers included, on development and CI machines). pip-audit
reads each pinned version and its hashes straight from the file (``--disable-pip --require-hashes``): nothing is
resolved, downloaded or installed. A finding fails the run unless audit-ignore.toml accepts it, with a reason and
a date after which it is an error again (look again: a fix released? still not affected?).

One line says the outcome; the exit code follows it:

    audit: ok: 215 packages in requirements.lock, ... (pypi), no known vulnerability              exit 0
    audit: FAILED: 1 known vulnerability not in audit-ignore.toml (...): bump the package or ...  exit 1
    audit: SKIPPED, nothing audited: cannot reach https://pypi.org/pypi/pip/24.0/json: ...        exit 0

each finding on a line of its own before the verdict (package==version, the locks pinning it, the advisory and its
aliases, the fixed versions), and each accepted one with its reason.

SKIPPED is for a machine that cannot reach the vulnerability data (no network, or a proxy that serves PyPI's index
but not its per-release JSON API, like this project's development machines; pip-audit alone then skips every
package as "not found on PyPI" and reports no vulnerability): it does not fail `make test` there, since nothing is
known either way; ``--strict`` (make audit AUDIT_ARGS=--strict) makes it fail, for a release build that must have
audited. An invalid or expired audit-ignore.toml fails the run even then.

Usage: python -m tools.audit [--strict] [--service pypi|osv] [--osv-url URL] [--ignore-file FILE] [LOCK ...]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

LOCKS = ("requirements.lock", "requirements-cuda.lock", "requirements-dev.lock")
IGNORE_FILE = "audit-ignore.toml"
IGNORE_KEYS = {"id", "package", "reason", "until"}
# An ignore entry is a decision to look again, not a permanent exemption.
MAX_IGNORE_DAYS = 366
# pip-audit's default service reads https://pypi.org/pypi/NAME/VERSION/json (its "vulnerabilities" list, which
# PyPI takes from the PyPA advisory database); osv asks api.osv.dev. The probe asks the same question about a
# release that certainly exists, so "unreachable" is told apart from "no vulnerability".
PYPI_PROBE = "https://pypi.org/pypi/pip/24.0/json"
OSV_URL = "https://api.osv.dev/v1/query"
OSV_PROBE = {"package": {"name": "pip", "ecosystem": "PyPI"}, "version": "24.0"}
PROBE_TIMEOUT_S = 20
# The `name==version` line of a pip-compile/uv block.
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", re.M)


class AuditError(Exception):
    """A problem that fails the audit (exit 1): a finding, a bad ignore file, pip-audit failing."""


class Unreachable(Exception):
    """The vulnerability data cannot be reached from here: the audit is skipped."""


@dataclass(frozen=True)
class Ignore:
    id: str
    package: str
    reason: str
    until: dt.date


@dataclass(frozen=True)
class Finding:
    package: str
    version: str
    ids: tuple[str, ...]
    fix_versions: tuple[str, ...]
    description: str
    locks: tuple[str, ...]


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def load_ignores(path: Path, today: dt.date) -> list[Ignore]:
    """The entries of the ignore file; every problem in it at once as one AuditError. No file: no entries."""
    if not path.exists():
        return []
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise AuditError(f"{path}: not valid TOML: {e}") from None
    unknown = sorted(set(data) - {"ignore"})
    problems = [f"unknown top-level key(s) {', '.join(unknown)} (only [[ignore]] entries)"] if unknown else []
    entries = data.get("ignore", [])
    if not isinstance(entries, list):
        raise AuditError(f"{path}: `ignore` must be a list of [[ignore]] tables")
    ignores = []
    for number, entry in enumerate(entries, 1):
        label = f"entry {number}" + (f" ({entry['id']})" if isinstance(entry.get("id"), str) else "")
        errors = entry_errors(entry, today)
        problems += [f"{label}: {error}" for error in errors]
        if not errors:
            ignores.append(Ignore(entry["id"], entry["package"], entry["reason"].strip(), as_date(entry["until"])))
    if problems:
        raise AuditError(f"{path}:\n" + "\n".join(f"  {p}" for p in problems))
    return ignores


def as_date(value: object) -> dt.date | None:
    # TOML has dates (until = 2027-03-01); a quoted "2027-03-01" is accepted too.
    if isinstance(value, dt.datetime):
        return None
    if isinstance(value, dt.date):
        return value
    if isinstance(value, str):
        try:
            return dt.date.fromisoformat(value)
        except ValueError:
            return None
    return None


def entry_errors(entry: dict, today: dt.date) -> list[str]:
    errors = []
    for key in sorted(set(entry) - IGNORE_KEYS):
        errors.append(f"unknown key {key!r} (an entry has {', '.join(sorted(IGNORE_KEYS))})")
    for key in ("id", "package", "reason"):
        if not isinstance(entry.get(key), str) or not entry[key].strip():
            errors.append(f"no {key}" + (" (why this vulnerability is accepted for now)" if key == "reason" else ""))
    if "until" not in entry:
        errors.append("no until (the date, YYYY-MM-DD, after which this entry is an error again)")
    elif (until := as_date(entry["until"])) is None:
        errors.append(f"until = {entry['until']!r} is not a date (YYYY-MM-DD)")
    elif until < today:
        errors.append(f"expired on {until}: look at it again (a fixed version? still not affected? a new date)")
    elif (until - today).days > MAX_IGNORE_DAYS:
        errors.append(f"until {until} is more than {MAX_IGNORE_DAYS} days away: pick a date to look again")
    return errors


def pins(lock: Path) -> set[tuple[str, str]]:
    return {(normalize(name), version) for name, version in PIN.findall(lock.read_text(encoding="utf-8"))}


def probe(service: str, osv_url: str) -> None:
    """Raise Unreachable unless the service answers a question about a release that exists."""
    import requests  # pip-audit's HTTP client: the same proxy and CA settings as the audit itself

    url = PYPI_PROBE if service == "pypi" else osv_url
    try:
        if service == "pypi":
            response = requests.get(url, timeout=PROBE_TIMEOUT_S)
        else:
            response = requests.post(url, data=json.dumps(OSV_PROBE), timeout=PROBE_TIMEOUT_S)
    except requests.RequestException as e:
        raise Unreachable(f"cannot reach {url}: {type(e).__name__}: {short(e)}") from None
    if response.status_code == 404 and service == "pypi":
        raise Unreachable(
            f"{url} answers 404 for a release that exists: the route to PyPI from here serves the package "
            "index but not the per-release JSON API (/pypi/NAME/VERSION/json) that holds the vulnerability data"
        )
    if response.status_code != 200:
        raise Unreachable(f"{url} answers HTTP {response.status_code}")
    try:
        body = response.json()
    except ValueError:
        raise Unreachable(f"{url} does not answer JSON (a captive portal or proxy page?)") from None
    if service == "pypi" and "vulnerabilities" not in body:
        raise Unreachable(f"{url} answers without vulnerability data")


def short(error: BaseException, limit: int = 160) -> str:
    text = " ".join(str(error).split())
    # requests' messages nest the cause at the end: "... (Caused by NameResolutionError(...: Failed to resolve ...))"
    if m := re.search(r"(Failed to resolve '[^']*'|Connection refused|timed out|CERTIFICATE_VERIFY_FAILED)", text):
        return m[1]
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run_pip_audit(locks: list[Path], service: str, osv_url: str) -> dict:
    """pip-audit's JSON report of the locks; Unreachable when the network goes away mid-run."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        command = [
            sys.executable, "-m", "pip_audit", "--progress-spinner", "off", "--format", "json", "--output", str(report),
            "--disable-pip", "--require-hashes", "--vulnerability-service", service, "--timeout", "30",
        ]  # fmt: skip
        if service == "osv":
            command += ["--osv-url", osv_url]
        for lock in locks:
            command += ["--requirement", str(lock)]
        done = subprocess.run(command, capture_output=True, text=True)
        if report.exists() and report.stat().st_size:
            return json.loads(report.read_text(encoding="utf-8"))
    # pip-audit writes no report when it found nothing and skipped nothing.
    if done.returncode == 0:
        return {"dependencies": [], "clean": True}
    last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
    if "ConnectionError" in done.stderr or "Could not connect" in done.stderr or "Timeout" in last:
        raise Unreachable(f"pip-audit lost the connection: {short(last)}")
    raise AuditError(f"pip-audit failed (exit {done.returncode}): {last}\n{done.stderr[-2000:]}")


def findings(report: dict, lock_pins: dict[str, set[tuple[str, str]]]) -> tuple[list[Finding], list[str], int]:
    """(findings, skipped "name (reason)", audited package count) of a pip-audit JSON report."""
    found, skipped, audited = [], [], 0
    for dep in report.get("dependencies", []):
        if "skip_reason" in dep:
            skipped.append(f"{dep['name']} ({dep['skip_reason']})")
            continue
        audited += 1
        key = (normalize(dep["name"]), dep["version"])
        locks = tuple(name for name, pinned in lock_pins.items() if key in pinned)
        for vuln in dep.get("vulns", []):
            found.append(
                Finding(
                    package=dep["name"],
                    version=dep["version"],
                    ids=(vuln["id"], *vuln.get("aliases", [])),
                    fix_versions=tuple(vuln.get("fix_versions", [])),
                    description=vuln.get("description") or "",
                    locks=locks,
                )
            )
    return found, skipped, audited


def accepted_by(finding: Finding, ignores: list[Ignore]) -> Ignore | None:
    ids = {i.upper() for i in finding.ids}
    for ignore in ignores:
        if ignore.id.upper() in ids and normalize(ignore.package) == normalize(finding.package):
            return ignore
    return None


def describe(finding: Finding) -> str:
    fix = f"fixed in {', '.join(finding.fix_versions)}" if finding.fix_versions else "no fixed version yet"
    where = ", ".join(finding.locks) or "?"
    text = finding.description if len(finding.description) <= 200 else finding.description[:197] + "..."
    return f"{finding.package}=={finding.version} ({where}): {' / '.join(finding.ids)}: {fix}: {text}"


def audit(
    locks: list[Path], ignore_file: Path, today: dt.date, service: str = "pypi", osv_url: str = OSV_URL
) -> tuple[int, list[str]]:
    """(exit code, lines to print, the last one the verdict); strictness is the caller's."""
    ignores = load_ignores(ignore_file, today)
    lock_pins = {lock.name: pins(lock) for lock in locks}
    probe(service, osv_url)
    report = run_pip_audit(locks, service, osv_url)
    found, skipped, audited = findings(report, lock_pins)
    if report.get("clean"):
        audited = len(set().union(*lock_pins.values()))
    if skipped and not audited:
        raise Unreachable(f"the service answered for none of the {len(skipped)} packages: {skipped[0]}")
    lines = [f"audit: warning: not audited: {s}" for s in skipped]
    failing, used = [], []
    for finding in found:
        if ignore := accepted_by(finding, ignores):
            used.append(ignore)
            lines.append(f"audit: accepted until {ignore.until} ({ignore_file.name}): {describe(finding)}")
            lines.append(f"       reason: {ignore.reason}")
        else:
            failing.append(finding)
            lines.append(f"audit: VULNERABLE: {describe(finding)}")
    for ignore in ignores:
        if ignore not in used:
            lines.append(f"audit: warning: {ignore_file.name}: {ignore.id} ({ignore.package}) matches no finding now")
    names = ", ".join(lock.name for lock in locks)
    if failing:
        lines.append(
            f"audit: FAILED: {len(failing)} known vulnerabilit{'y' if len(failing) == 1 else 'ies'} not in "
            f"{ignore_file.name} ({names}): bump the package (make lock) or add an [[ignore]] entry with a reason"
        )
        return 1, lines
    accepted = len(found)
    lines.append(
        f"audit: ok: {audited} packages in {names} ({service}), no known vulnerability"
        + (f" but the {accepted} accepted in {ignore_file.name}" if accepted else "")
        + (f"; {len(skipped)} not audited" if skipped else "")
    )
    return 0, lines


def main(argv: list[str] | None = None, today: dt.date | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("locks", nargs="*", type=Path, default=[Path(lock) for lock in LOCKS])
    parser.add_argument("--ignore-file", type=Path, default=Path(IGNORE_FILE))
    parser.add_argument("--service", choices=("pypi", "osv"), default="pypi", help="pip-audit's; default pypi")
    parser.add_argument("--osv-url", default=OSV_URL)
    parser.add_argument("--strict", action="store_true", help="fail when the vulnerability data cannot be reached")
    args = parser.parse_args(argv)
    today = today or dt.datetime.now(dt.UTC).date()
    try:
        code, lines = audit(args.locks, args.ignore_file, today, args.service, args.osv_url)
    except AuditError as e:
        print(f"audit: FAILED: {e}")
        return 1
    except Unreachable as e:
        verdict = "FAILED (--strict)" if args.strict else "SKIPPED, nothing audited"
        print(f"audit: {verdict}: {e}")
        return 1 if args.strict else 0
    print("\n".join(lines))
    return code


if __name__ == "__main__":
    sys.exit(main())
