"""`python -m fleetpilot.replay`: the replay command on its own, before or without the `fleetpilot` CLI."""

from __future__ import annotations

import sys

from fleetpilot.replay import cli

sys.exit(cli.main())
