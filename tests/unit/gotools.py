"""The Go test programs under tests/ (tests/*/NAME: a go.mod, a go.sum and main.go), as built by scripts/install.sh.

Each is built into ~/.cache/fleetpilot/gotools/NAME with a stamp holding the digest of the sources
it came from; a binary built from other sources is refused (rerun scripts/install.sh) rather than
tested. The digest is the one install.sh takes: sha256 of go.mod, go.sum and the *.go files in name
order, concatenated, first 16 hex digits.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from fleetpilot.devcluster import cluster as devcluster

TESTS = Path(__file__).resolve().parents[1]


def go_tool(name: str) -> Path:
    (source,) = TESTS.glob(f"*/{name}/go.mod")
    folder = source.parent
    files = [folder / "go.mod", folder / "go.sum", *sorted(folder.glob("*.go"))]
    digest = hashlib.sha256(b"".join(path.read_bytes() for path in files)).hexdigest()[:16]
    binary = devcluster.CACHE / "gotools" / name
    stamp = binary.with_name(f"{name}.stamp")
    built = stamp.read_text().strip() if stamp.is_file() else None
    assert binary.is_file() and built == digest, (
        f"{binary} is missing or was built from other sources than {folder}: run scripts/install.sh")
    return binary
