"""What a shared pool's service is told in one file: policy, weights, admins and limits.

``/etc/dlsched/service.toml`` (or ``dlsched service run --config FILE``)::

    policy = "fair"                 # any dlsched policy; fair share between users by default
    admin_group = "dlsched-admin"   # members (and root) may steer every job

    [weights]                       # fair-share weights: a user, or "@group"
    ana = 2
    "@interns" = 0.5

    [limits]                        # per user; leave one out for no limit
    max_gpus = 4                    # GPUs held at once by one user's running jobs
    max_running = 8                 # running jobs of one user
    max_queued = 10000              # waiting jobs of one user (more are refused at submit)
    max_priority = "high"           # the highest priority a user may ask for (admins: any)

    [limits.users.ana]              # one user's own limits
    max_gpus = 8
"""

from __future__ import annotations

import grp
import os
import pwd
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from ..errors import SpecError
from ..spec import parse_priority

DEFAULT_CONFIG = Path("/etc/dlsched/service.toml")
_LIMIT_KEYS = ("max_gpus", "max_running", "max_queued", "max_priority")


@dataclass(frozen=True)
class Limits:
    """One user's limits (``None``: no limit)."""

    max_gpus: float | None = None
    max_running: int | None = None
    max_priority: int | None = None
    max_queued: int | None = None


@dataclass
class ServiceConfig:
    """The parsed configuration of a shared pool (``ServiceConfig.load(path)``)."""

    policy: str = "fair"
    policy_params: dict[str, Any] = field(default_factory=dict)
    admin_group: str | None = None
    weights: dict[str, float] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)
    user_limits: dict[str, Limits] = field(default_factory=dict)
    path: Path | None = None

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None) -> ServiceConfig:
        """Read ``path`` (a missing default file means the defaults); bad values name the key."""
        if path is None:
            if not DEFAULT_CONFIG.exists():
                return cls(limits=Limits(max_priority=parse_priority("high")))
            path = DEFAULT_CONFIG
        file = Path(path)
        try:
            data = tomllib.loads(file.read_text())
        except OSError as error:
            raise SpecError("config", str(file), f"a readable file ({error.strerror})") from None
        except tomllib.TOMLDecodeError as error:
            raise SpecError("config", str(file), f"TOML ({error})") from None
        unknown = set(data) - {"policy", "policy_params", "admin_group", "weights", "limits"}
        if unknown:
            key = sorted(unknown)[0]
            raise SpecError(
                key, data[key], "one of policy, policy_params, admin_group, weights, limits"
            )
        limits_table = dict(data.get("limits") or {})
        users = limits_table.pop("users", {}) or {}
        if "max_priority" not in limits_table:
            limits_table["max_priority"] = "high"  # urgent is for admins unless configured
        weights = {}
        for who, weight in (data.get("weights") or {}).items():
            if isinstance(weight, bool) or not isinstance(weight, int | float) or weight <= 0:
                raise SpecError(f"weights.{who}", weight, "a number above zero")
            weights[str(who)] = float(weight)
        params = data.get("policy_params") or {}
        if not isinstance(params, dict):
            raise SpecError("policy_params", params, "a table of policy parameters")
        return cls(
            policy=str(data.get("policy", "fair")),
            policy_params=params,
            admin_group=data.get("admin_group"),
            weights=weights,
            limits=_limits(limits_table, "limits"),
            user_limits={
                str(u): _limits({**limits_table, **dict(t)}, f"limits.users.{u}")
                for u, t in users.items()
            },
            path=file,
        )

    def limits_for(self, user: str) -> Limits:
        return self.user_limits.get(user, self.limits)

    def is_admin(self, uid: int, service_uid: int) -> bool:
        """Root, the service's own user, and members of ``admin_group`` are admins."""
        if uid in (0, service_uid):
            return True
        if not self.admin_group:
            return False
        try:
            group = grp.getgrnam(self.admin_group)
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            return False
        return name in group.gr_mem or pwd.getpwuid(uid).pw_gid == group.gr_gid

    def owner_weights(self) -> dict[str, float]:
        """Fair-share weights by user name, groups (``"@group"``) spread over their members."""
        weights: dict[str, float] = {}
        for who, weight in self.weights.items():
            if who.startswith("@"):
                try:
                    members = grp.getgrnam(who[1:]).gr_mem
                except KeyError:
                    continue
                for member in members:
                    weights.setdefault(member, weight)
        for who, weight in self.weights.items():
            if not who.startswith("@"):
                weights[who] = weight
        return weights


def _limits(table: dict[str, Any], where: str) -> Limits:
    unknown = set(table) - set(_LIMIT_KEYS)
    if unknown:
        key = sorted(unknown)[0]
        raise SpecError(f"{where}.{key}", table[key], "one of " + ", ".join(_LIMIT_KEYS))
    gpus = table.get("max_gpus")
    running = table.get("max_running")
    queued = table.get("max_queued")
    for key, value in (("max_gpus", gpus), ("max_running", running), ("max_queued", queued)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or value < 0
        ):
            raise SpecError(f"{where}.{key}", value, "a number of at least 0")
    priority = table.get("max_priority")
    return Limits(
        max_gpus=float(gpus) if gpus is not None else None,
        max_running=int(running) if running is not None else None,
        max_priority=parse_priority(priority) if priority is not None else None,
        max_queued=int(queued) if queued is not None else None,
    )
