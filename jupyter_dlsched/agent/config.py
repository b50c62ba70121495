"""What a shared pool's service is told in one file: policy, weights, admins and limits.

``/etc/dlsched/service.toml`` (or ``dlsched service run --config FILE``)::

    policy = "fair"                 # any dlsched policy; fair share between users by default
    admin_group = "dlsched-admin"   # members (and root) may steer every job
    min_schedule_interval = "1m"    # --every closer than this is refused (default 1 minute)

    [weights]                       # fair-share weights: a user, or "@group"
    ana = 2
    "@interns" = 0.5

    [limits]                        # per user; leave one out for no limit
    max_gpus = 4                    # GPUs held at once by one user's running jobs
    max_running = 8                 # running jobs of one user
    max_queued = 10000              # waiting jobs of one user (more are refused at submit)
    max_priority = "high"           # the highest priority a user may ask for (admins: any)
    max_payload_bytes = "1GiB"      # what one user's unfinished jobs' payloads may take
    max_cache_bytes = "200GiB"      # what one user's staged inputs may hold in the data cache
    max_schedules = 20              # schedules (--every) of one user (default 20)
    max_schedule_runs_per_hour = 600  # runs one user's schedules make an hour (default 600)

    [limits.users.ana]              # one user's own limits
    max_gpus = 8

Every value is checked when the service starts: a wrong type, a number out of range,
NaN or infinity, a fraction of a byte or a limit of no bytes, a user or group the
machine does not know (a typo would otherwise weigh or limit nobody, or make nobody an
admin) is refused with the key, the value and what is allowed.
"""

from __future__ import annotations

import grp
import logging
import math
import os
import pwd
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from ..vocab.errors import SpecError
from ..vocab.spec import MAX_GPUS, check_text, parse_priority
from ..vocab.units import parse_size, parse_size_exact

log = logging.getLogger("jupyter_dlsched.agent")

DEFAULT_CONFIG = Path("/etc/dlsched/service.toml")
_TOP_KEYS = (
    "policy",
    "policy_params",
    "admin_group",
    "weights",
    "limits",
    # schedules
    "min_schedule_interval",
)
_LIMIT_KEYS = (
    "max_gpus",
    "max_running",
    "max_queued",
    "max_priority",
    "max_payload_bytes",
    "max_cache_bytes",
    # schedules
    "max_schedules",
    "max_schedule_runs_per_hour",
)
#: Running or waiting jobs of one user a limit may name (the ledger's integers hold more;
#: a larger number is a typo, not a plan).
MAX_JOBS = 10**9


@dataclass(frozen=True)
class Limits:
    """One user's limits (``None``: no limit)."""

    max_gpus: float | None = None
    max_running: int | None = None
    max_priority: int | None = None
    max_queued: int | None = None
    #: bytes the payloads of one user's unfinished jobs may take in the ledger
    max_payload_bytes: int | None = None
    #: bytes one user's entries may hold in the data cache (staged inputs)
    max_cache_bytes: int | None = None
    # -- schedules (``--every``): each tick makes a job, which ends and frees its place in
    # max_queued at once, so a user's schedules are capped, and the runs they make an hour
    #: schedules one user may hold
    max_schedules: int | None = 20
    #: runs one user's schedules may make in an hour; a tick past it is skipped
    max_schedule_runs_per_hour: int | None = 600


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
    #: seconds at least between two ticks of a schedule (written to the ledger's settings)
    min_schedule_interval: float = 60.0

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None) -> ServiceConfig:
        """Read ``path`` (a missing default file means the defaults) and check every value:
        ``SpecError`` names the first bad key, its value and what is allowed."""
        if path is None:
            if not DEFAULT_CONFIG.exists():
                return cls(limits=Limits(max_priority=parse_priority("high")))
            path = DEFAULT_CONFIG
        file = Path(path)
        try:
            data = tomllib.loads(file.read_text())
        except OSError as error:
            raise SpecError("config", str(file), f"a readable file ({error.strerror})") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
            raise SpecError("config", str(file), f"TOML ({error})") from None
        unknown = set(data) - set(_TOP_KEYS)
        if unknown:
            key = sorted(unknown)[0]
            raise SpecError(key, data[key], "one of " + ", ".join(_TOP_KEYS))
        policy = data.get("policy", "fair")
        params = _table(data.get("policy_params"), "policy_params", "a table of policy parameters")
        _check_policy(policy, params)
        admin_group = data.get("admin_group")
        if admin_group is not None:
            admin_group = check_text(admin_group, "admin_group")
            _known("admin_group", admin_group, group=True)
        weights = {}
        for who, weight in _table(data.get("weights"), "weights", "a table of weights").items():
            weights[who] = _number(weight, f"weights.{who}", "a number above zero", low=0.0)
            if weights[who] <= 0:
                raise SpecError(f"weights.{who}", weight, "a number above zero")
            group = who.startswith("@")
            _known(f"weights.{who}", who[1:] if group else who, group=group)
        limits_table = dict(_table(data.get("limits"), "limits", "a table of limits"))
        users = _table(limits_table.pop("users", None), "limits.users", "a table of users")
        if "max_priority" not in limits_table:
            limits_table["max_priority"] = "high"  # urgent is for admins unless configured
        user_limits = {}
        for user, table in users.items():
            where = f"limits.users.{user}"
            user_limits[user] = _limits({**limits_table, **_table(table, where, "a table")}, where)
            _known(where, user, group=False)
        return cls(
            policy=policy,
            policy_params=params,
            admin_group=admin_group,
            weights=weights,
            limits=_limits(limits_table, "limits"),
            user_limits=user_limits,
            path=file,
            min_schedule_interval=_interval(data.get("min_schedule_interval", 60.0)),
        )

    def limits_for(self, user: str) -> Limits:
        return self.user_limits.get(user, self.limits)

    def is_admin(self, uid: int, service_uid: int) -> bool:
        """Root, the service's own user, and members of ``admin_group`` are admins.

        A directory service that fails (LDAP down, a broken NSS module) makes a peer
        a plain user, never an error: it must not end the service that serves everyone.
        """
        if uid in (0, service_uid):
            return True
        if not self.admin_group:
            return False
        try:
            group = grp.getgrnam(self.admin_group)
            entry = pwd.getpwuid(uid)
        except KeyError:
            return False
        except Exception as error:
            log.warning("dlsched service: cannot tell whether uid %s is an admin: %s", uid, error)
            return False
        return entry.pw_name in group.gr_mem or entry.pw_gid == group.gr_gid

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


def _known(where: str, name: str, *, group: bool) -> None:
    """Refuse a user or group the machine does not know: a misspelt name in the file would
    weigh, limit or make an admin of nobody, in silence. One that is created later is
    added to the file then (and the service restarted). A directory service that fails
    leaves the name as written, with a warning: it must not keep the pool from starting."""
    what = "a group of this machine" if group else "a user of this machine"
    if not name:
        raise SpecError(where, name, f"{what} (an empty name names nobody)")
    try:
        (grp.getgrnam if group else pwd.getpwnam)(name)
    except KeyError:
        raise SpecError(where, name, f"{what} (no such {'group' if group else 'user'})") from None
    except Exception as error:
        log.warning("dlsched service: cannot tell whether %s %r exists: %s", where, name, error)


def _table(value: object, where: str, allowed: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpecError(where, value, allowed)
    return value


def _number(
    value: object, where: str, allowed: str, *, low: float, high: float = math.inf
) -> float:
    """A finite number from ``low`` to ``high``: no bool, NaN, infinity or string."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        raise SpecError(where, value, allowed)
    return float(value)


def _whole(value: object, where: str, allowed: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_JOBS:
        raise SpecError(where, value, allowed)
    return value


def _check_policy(policy: object, params: dict[str, Any]) -> None:
    """A known policy, and parameters of the types its defaults have (a string where a
    number belongs would fail at the first decision, with the pool already serving)."""
    from ..policy import POLICIES, get_policy

    if not isinstance(policy, str) or policy not in POLICIES:
        raise SpecError("policy", policy, "one of " + ", ".join(sorted(POLICIES)))
    defaults = get_policy(policy)
    for key, value in params.items():
        where = f"policy_params.{key}"
        if key == "name" or not hasattr(defaults, key):
            continue  # get_policy below names the parameters the policy has
        default = getattr(defaults, key)
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise SpecError(where, value, "true or false")
        elif isinstance(default, dict):
            for who, weight in _table(value, where, "a table of weights").items():
                if _number(weight, f"{where}.{who}", "a number above zero", low=0.0) <= 0:
                    raise SpecError(f"{where}.{who}", weight, "a number above zero")
        elif isinstance(default, tuple | list) or isinstance(value, list):
            if not isinstance(value, list) or not value:
                raise SpecError(where, value, "a list of numbers of at least 0")
            for item in value:
                _number(item, where, "a list of finite numbers of at least 0", low=0.0)
        else:
            _number(value, where, "a finite number of at least 0", low=0.0)
    if "name" in params:
        raise SpecError("policy_params.name", params["name"], "no name (set policy instead)")
    get_policy(policy, **params)


def _limits(table: dict[str, Any], where: str) -> Limits:
    unknown = set(table) - set(_LIMIT_KEYS)
    if unknown:
        key = sorted(unknown)[0]
        raise SpecError(f"{where}.{key}", table[key], "one of " + ", ".join(_LIMIT_KEYS))
    gpus = table.get("max_gpus")
    running = table.get("max_running")
    queued = table.get("max_queued")
    priority = table.get("max_priority")
    payload = _size(table.get("max_payload_bytes"), f"{where}.max_payload_bytes")
    cached = _size(table.get("max_cache_bytes"), f"{where}.max_cache_bytes")
    jobs = f"a whole number of jobs from 0 to {MAX_JOBS:,}"
    try:
        max_priority = parse_priority(priority) if priority is not None else None
    except SpecError as error:
        raise SpecError(f"{where}.max_priority", priority, error.allowed) from None
    schedules = _whole(table.get("max_schedules", 20), f"{where}.max_schedules", "a whole number")
    runs = table.get("max_schedule_runs_per_hour", 600)
    runs = _whole(runs, f"{where}.max_schedule_runs_per_hour", "a whole number of runs")
    return Limits(
        max_schedules=schedules,
        max_schedule_runs_per_hour=runs,
        max_gpus=(
            _number(
                gpus,
                f"{where}.max_gpus",
                f"a number of GPUs from 0 to {MAX_GPUS}",
                low=0.0,
                high=MAX_GPUS,
            )
            if gpus is not None
            else None
        ),
        max_running=_whole(running, f"{where}.max_running", jobs) if running is not None else None,
        max_priority=max_priority,
        max_queued=_whole(queued, f"{where}.max_queued", jobs) if queued is not None else None,
        max_payload_bytes=payload,
        max_cache_bytes=cached,
    )


def _interval(value: object) -> float:
    """``min_schedule_interval``: a duration (``"1m"``, or seconds) of 0 or more."""
    from ..store.settings import check_resize_every

    try:
        seconds = check_resize_every(value, "min_schedule_interval")
    except SpecError as error:
        raise SpecError("min_schedule_interval", value, error.allowed) from None
    assert seconds is not None
    return seconds


def _size(value: Any, where: str) -> int | None:
    """A size limit (``"1GiB"`` or bytes), or None when the key is left out."""
    if value is None:
        return None
    allowed = "a size of at least one whole byte, such as '1GiB' or 1000"
    try:
        size = parse_size(value, where)
    except SpecError:
        raise SpecError(where, value, allowed) from None
    # parse_size rounds down: 1.5 would be one byte, 0.5 none, and a limit of no bytes
    # refuses every submission (or every stage-in)
    if size < 1 or size != parse_size_exact(value):
        raise SpecError(where, value, allowed)
    return size
