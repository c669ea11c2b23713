#!/usr/bin/env bash
# One command for a fresh machine: install everything, then run the demo.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bash "$here/install.sh"
bash "$here/demo.sh"
