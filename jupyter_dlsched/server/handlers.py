"""REST handlers under ``/dlsched/api/v1/``; the table at the bottom is the whole API.

Every handler requires Jupyter's authentication. Bad input is answered with a JSON
400 (or 404 for an unknown job) whose ``message`` says what was wrong.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import tornado.web
from jupyter_server.base.handlers import APIHandler

from ..errors import IllegalTransition, JobNotFound, SpecError
from .logs import MAX_CHUNK, read_log
from .state import ServerState

API_PREFIX = "/dlsched/api/v1"
#: Job ids are short lower-case words; anything else (slashes, dots, escapes) is refused.
JOB_ID = re.compile(r"^[a-z0-9]{1,32}$")
#: Rows of utilisation history returned at most; longer ranges are thinned evenly.
MAX_SAMPLES = 20_000
MAX_PAGE = 1000


class ApiError(tornado.web.HTTPError):
    """An error answer whose ``message`` (JSON body) says what was wrong.

    The message often quotes the request, so it goes in the body only; the status
    line keeps the standard reason phrase.
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(status)
        self.message = message


class DlschedHandler(APIHandler):
    """Common parts: the server state, argument parsing, JSON answers."""

    @property
    def dlsched(self) -> ServerState:
        state: ServerState = self.settings["dlsched"]
        return state

    def send(self, payload: Any, status: int = 200) -> None:
        body = json.dumps(payload)
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        # time spent in the server (shown by browser dev tools; used by benchmarks/rest.py)
        self.set_header("Server-Timing", f"app;dur={1000 * self.request.request_time():.2f}")
        self.finish(body)

    def int_arg(
        self, name: str, default: int | None, low: int = 0, high: int | None = None
    ) -> int | None:
        raw = self.get_query_argument(name, None)
        if raw is None or raw == "":
            return default
        try:
            value = int(raw)
        except ValueError:
            raise ApiError(400, f"{name}={raw!r}: expected a whole number") from None
        if value < low or (high is not None and value > high):
            limit = f"between {low} and {high}" if high is not None else f">= {low}"
            raise ApiError(400, f"{name}={value}: expected a number {limit}")
        return value

    def float_arg(self, name: str, default: float) -> float:
        raw = self.get_query_argument(name, None)
        if raw is None or raw == "":
            return default
        try:
            value = float(raw)
        except ValueError:
            raise ApiError(400, f"{name}={raw!r}: expected a number") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise ApiError(400, f"{name}={raw!r}: expected a finite number")
        return value

    def job_id(self, raw: str) -> str:
        if not JOB_ID.match(raw):
            raise ApiError(
                400, f"{raw[:40]!r} is not a job id (short lower-case letters and digits)"
            )
        return raw

    def job_json(self, job_id: str) -> dict[str, Any]:
        try:
            return self.dlsched.job_json(job_id)
        except JobNotFound as exc:
            raise ApiError(404, str(exc)) from None

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        # One JSON shape for every error: {"message", "status"}, never a traceback.
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, ApiError):
            message = exc.message
        elif isinstance(exc, tornado.web.HTTPError) and exc.log_message and status_code < 500:
            message = exc.log_message
        else:
            message = self._reason
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"message": message, "status": status_code}))


class StatusHandler(DlschedHandler):
    @tornado.web.authenticated
    def get(self) -> None:
        self.send(self.dlsched.status())


class PoolHandler(DlschedHandler):
    @tornado.web.authenticated
    def get(self) -> None:
        self.send(self.dlsched.pool_json())


class JobsHandler(DlschedHandler):
    @tornado.web.authenticated
    def get(self) -> None:
        states = None
        raw_state = self.get_query_argument("state", None)
        if raw_state:
            states = [s.strip() for s in raw_state.split(",") if s.strip()]
            unknown = [s for s in states if s not in self.dlsched.states]
            if unknown:
                allowed = ", ".join(self.dlsched.states)
                raise ApiError(
                    400, f"state={unknown[0]!r} is not a state; expected one of {allowed}"
                )
        owner = self.get_query_argument("owner", None) or None
        limit = self.int_arg("limit", 50, low=1, high=MAX_PAGE)
        offset = self.int_arg("offset", 0, low=0)
        order = self.get_query_argument("order", "newest")
        if order not in ("newest", "oldest", "queue"):
            raise ApiError(400, f"order={order!r}: expected newest, oldest or queue")
        assert limit is not None and offset is not None
        jobs = self.dlsched.jobs_json(states, owner, limit, offset, order)
        self.send(
            {
                "jobs": jobs,
                "limit": limit,
                "offset": offset,
                "next_offset": offset + limit if len(jobs) == limit else None,
            }
        )


class JobHandler(DlschedHandler):
    @tornado.web.authenticated
    def get(self, job_id: str) -> None:
        self.send(self.job_json(self.job_id(job_id)))

    @tornado.web.authenticated
    def patch(self, job_id: str) -> None:
        job_id = self.job_id(job_id)
        try:
            body = json.loads(self.request.body or b"null")
        except ValueError:
            raise ApiError(400, "the body is not JSON") from None
        if not isinstance(body, dict) or set(body) != {"priority"}:
            raise ApiError(
                400,
                'expected a JSON object {"priority": <number or low/normal/high/urgent>}',
            )
        priority = body["priority"]
        if isinstance(priority, bool) or not isinstance(priority, int | str):
            raise ApiError(
                400,
                f"priority={priority!r}: expected a whole number or low, normal, high, urgent",
            )
        try:
            self.dlsched.set_priority(job_id, priority)
        except JobNotFound as exc:
            raise ApiError(404, str(exc)) from None
        except SpecError as exc:
            raise ApiError(400, str(exc)) from None
        except IllegalTransition as exc:
            raise ApiError(409, str(exc)) from None
        self.send(self.job_json(job_id))


class CancelHandler(DlschedHandler):
    @tornado.web.authenticated
    def post(self, job_id: str) -> None:
        job_id = self.job_id(job_id)
        try:
            self.dlsched.cancel(job_id)
        except JobNotFound as exc:
            raise ApiError(404, str(exc)) from None
        except IllegalTransition as exc:
            raise ApiError(409, str(exc)) from None
        self.send(self.job_json(job_id))


class LogHandler(DlschedHandler):
    @tornado.web.authenticated
    def get(self, job_id: str) -> None:
        job_id = self.job_id(job_id)
        self.job_json(job_id)  # 404 for an unknown job
        offset = self.int_arg("offset", None, low=0)
        tail = self.int_arg("tail", None, low=0, high=100_000)
        max_bytes = self.int_arg("max_bytes", MAX_CHUNK, low=1, high=MAX_CHUNK)
        if offset is not None and tail is not None:
            raise ApiError(400, "give offset or tail, not both")
        assert max_bytes is not None
        chunk = read_log(self.dlsched.log_path(job_id), offset, tail, max_bytes)
        self.send({"id": job_id, **chunk})


class MetricsHandler(DlschedHandler):
    @tornado.web.authenticated
    def get(self) -> None:
        now = time.time()
        until = self.float_arg("until", now)
        since = self.float_arg("since", until - 3600.0)
        if since > until:
            raise ApiError(400, f"since={since} is after until={until}")
        source = self.get_query_argument("source", None) or None
        samples = self.dlsched.samples(since, until, source, MAX_SAMPLES)
        self.send(
            {
                "since": since,
                "until": until,
                "interval": self.dlsched.sample_interval,
                "retention": self.dlsched.history_retention,
                "samples": samples,
            }
        )


_ID = r"(?P<job_id>[^/]+)"

#: The whole REST API (also described by openapi.json next to this file).
HANDLERS: list[tuple[str, type[DlschedHandler]]] = [
    (f"{API_PREFIX}/status", StatusHandler),
    (f"{API_PREFIX}/pool", PoolHandler),
    (f"{API_PREFIX}/jobs", JobsHandler),
    (f"{API_PREFIX}/jobs/{_ID}", JobHandler),
    (f"{API_PREFIX}/jobs/{_ID}/log", LogHandler),
    (f"{API_PREFIX}/jobs/{_ID}/cancel", CancelHandler),
    (f"{API_PREFIX}/metrics", MetricsHandler),
]
