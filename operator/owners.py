"""Who controls a Kubernetes object: its ownerReference with `controller: true` (pure, plain manifests).

The reconciler, rollouts and multinode groups all tell their own children from other people's objects by
this one reference; at most one owner of an object may be its controller.
"""

from __future__ import annotations

from typing import Any

Manifest = dict[str, Any]


def controller_ref(obj: Manifest) -> Manifest | None:
    """The object's controlling ownerReference, or None."""
    for ref in obj.get("metadata", {}).get("ownerReferences", []) or []:
        if ref.get("controller"):
            return dict(ref)
    return None


def controller_uid(obj: Manifest) -> str | None:
    """The uid of the object's controlling owner, or None."""
    ref = controller_ref(obj)
    return None if ref is None else str(ref.get("uid"))
