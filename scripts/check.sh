#!/usr/bin/env bash
# Static checks: generated CRDs up to date, ruff, mypy (strict) and the import-linter layer contracts.
#
# operator/ and planner/ are the packages fleetpilot.operator and fleetpilot.planner only through
# pyproject's package-dir mapping, which type checkers and import-linter cannot follow. They check
# a throw-away tree of symlinks laid out as the installed package is.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE="${FLEETPILOT_CACHE:-$HOME/.cache/fleetpilot}"
export PATH="$CACHE/venv/bin:$PATH"
cd "$repo"

fleetpilot crds --check
ruff check fleetpilot operator planner tests benchmarks scripts e2e

tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
mkdir "$tree/fleetpilot"
ln -s "$repo"/fleetpilot/* "$tree/fleetpilot/"
ln -s "$repo/operator" "$tree/fleetpilot/operator"
ln -s "$repo/planner" "$tree/fleetpilot/planner"
(cd "$tree" && MYPYPATH="$tree" mypy --config-file "$repo/pyproject.toml" -p fleetpilot)
(cd "$tree" && PYTHONPATH="$tree" lint-imports --config "$repo/pyproject.toml")
