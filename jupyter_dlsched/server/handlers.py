"""REST handlers under ``/dlsched/api/v1/``; the table at the bottom is the whole API.

Every handler requires Jupyter's authentication. Bad input is answered with a 4xx,
never a 5xx: 400 for a bad argument or body, 404 for an unknown job, 405 for a
method a route does not have (with ``Allow``), 409 for a change the job's state
does not allow, 413 for a body that is too large. Every error body has one shape,
``{"message": ..., "status": ...}`` (``Error`` in openapi.json), and the message
says what was wrong and what is allowed.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import tornado.web
from jupyter_server.base.handlers import APIHandler

from ..vocab.errors import DlschedError, IllegalTransition, JobNotFound, PermissionDenied
from ..vocab.spec import MAX_PRIORITY, PRIORITY_HELP, PRIORITY_NAMES
from .logs import MAX_CHUNK, read_log
from .state import ServerState

API_PREFIX = "/dlsched/api/v1"
#: Job ids are short lower-case words; anything else (slashes, dots, escapes) is refused.
JOB_ID = re.compile(r"^[a-z0-9]{1,32}$")
#: The longest accounting period, in seconds (ten years of 366 days).
MAX_ACCOUNTING = 316224000
#: Rows of utilisation history returned at most; longer ranges are thinned evenly.
MAX_SAMPLES = 20_000
MAX_PAGE = 1000
#: Most log lines one tail call returns.
MAX_TAIL = 100_000
#: Largest offset accepted (jobs or log bytes): 2**53 - 1, the largest whole number a
#: JavaScript client holds exactly, and far from SQLite's 2**63 - 1 even after adding a page.
MAX_OFFSET = 2**53 - 1
#: Largest request body read; a PATCH holds one small field, so anything bigger is a mistake.
MAX_BODY = 16 * 1024
#: What a parsed JSON value is called in JSON's own words, for messages.
JSON_KINDS: dict[type, str] = {
    list: "array",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


class ApiError(tornado.web.HTTPError):
    """An error answer whose ``message`` (JSON body) says what was wrong.

    The message often quotes the request, so it goes in the body only; the status
    line keeps the standard reason phrase.
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(status)
        self.message = message


@contextmanager
def scheduler_errors() -> Iterator[None]:
    """Turn what the scheduler refuses into the matching 4xx answer, never a 500.

    >>> with scheduler_errors():  # doctest: +SKIP
    ...     state.set_priority(job_id, 5)  # an unknown id becomes a 404 with the scheduler's message
    """
    try:
        yield
    except JobNotFound as exc:
        raise ApiError(404, str(exc)) from None
    except PermissionDenied as exc:  # another user's job in a shared pool
        raise ApiError(403, str(exc)) from None
    except IllegalTransition as exc:
        raise ApiError(409, str(exc)) from None
    except DlschedError as exc:  # SpecError and every other refusal a user can cause
        raise ApiError(400, str(exc)) from None
    except OverflowError:
        # a whole number past SQLite's 64 bits that got through validation
        raise ApiError(400, "a number in the request is too large to store") from None


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

    def int_arg(self, name: str, default: int | None, low: int, high: int) -> int | None:
        """The query argument ``name`` as a whole number in ``[low, high]``, else a 400.

        Every integer argument has an upper bound, so no value can overflow SQLite's
        64-bit integers or ask for an unbounded amount of work.
        """
        raw = self.get_query_argument(name, None)
        if raw is None:  # given but empty is a mistake, not the default
            return default
        try:
            value = int(raw)
        except ValueError:  # also a number too long to convert (Python's digit limit)
            raise ApiError(400, f"{name}={raw[:40]!r}: expected a whole number") from None
        if not low <= value <= high:
            raise ApiError(
                400, f"{name}={raw[:40]}: expected a whole number between {low} and {high}"
            )
        return value

    def float_arg(self, name: str, default: float) -> float:
        raw = self.get_query_argument(name, None)
        if raw is None:  # given but empty is a mistake, not the default
            return default
        try:
            value = float(raw)
        except ValueError:
            raise ApiError(400, f"{name}={raw[:40]!r}: expected a number") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise ApiError(400, f"{name}={raw[:40]!r}: expected a finite number")
        return value

    def job_id(self, raw: str) -> str:
        if not JOB_ID.match(raw):
            raise ApiError(
                400, f"{raw[:40]!r} is not a job id (short lower-case letters and digits)"
            )
        return raw

    def job_json(self, job_id: str) -> dict[str, Any]:
        with scheduler_errors():
            return self.dlsched.job_json(job_id)

    def json_body(self, example: str) -> dict[str, Any]:
        """The request body as a JSON object, or a 400/413 that says what is wrong with it.

        ``example`` (a body this call takes) ends the message when the body is no object.
        """
        body = self.request.body or b""
        if len(body) > MAX_BODY:
            raise ApiError(413, f"the body has {len(body)} bytes; at most {MAX_BODY} are read")
        if not body.strip():
            raise ApiError(400, f"the body is empty; expected a JSON object like {example}")
        try:
            parsed = json.loads(body)
        except RecursionError:
            raise ApiError(
                400, "the body is not JSON this API reads: it is nested too deeply"
            ) from None
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError both are
            raise ApiError(400, f"the body is not JSON: {exc}") from None
        if not isinstance(parsed, dict):
            kind = JSON_KINDS.get(type(parsed), "value")
            raise ApiError(400, f"the body is a JSON {kind}; expected an object like {example}")
        return parsed

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        # One JSON shape for every error: {"message", "status"}, never a traceback.
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, ApiError):
            message = exc.message
        elif isinstance(exc, tornado.web.HTTPError) and exc.log_message and status_code < 500:
            message = exc.log_message
        else:
            message = self._reason
        if status_code == 405:
            allowed = [m.upper() for m in ("get", "post", "patch") if m in vars(type(self))]
            self.set_header("Allow", ", ".join(allowed))
            message = f"{self.request.method} is not allowed here; use {' or '.join(allowed)}"
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


class CacheHandler(DlschedHandler):
    @tornado.web.authenticated
    def get(self) -> None:
        self.send(self.dlsched.cache_json())


class JobsHandler(DlschedHandler):
    @tornado.web.authenticated
    def get(self) -> None:
        states = None
        raw_state = self.get_query_argument("state", None)
        if raw_state is not None:
            # exactly the state words, so what is accepted is what openapi.json describes
            states = raw_state.split(",")
            unknown = [s for s in states if s not in self.dlsched.states]
            if unknown:
                allowed = ", ".join(self.dlsched.states)
                raise ApiError(
                    400,
                    f"state={unknown[0][:40]!r} is not a state; expected a comma-separated "
                    f"list of {allowed}",
                )
        owner = self.get_query_argument("owner", None) or None
        limit = self.int_arg("limit", 50, low=1, high=MAX_PAGE)
        offset = self.int_arg("offset", 0, low=0, high=MAX_OFFSET)
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
        body = self.json_body(example='{"priority": "high"}')
        unknown = sorted(set(body) - {"priority"})
        if unknown:
            raise ApiError(400, f"unknown field {unknown[0][:40]!r}: the body holds only priority")
        if "priority" not in body:
            raise ApiError(400, 'the body has no priority; expected {"priority": 100} or "high"')
        priority = self.priority(body["priority"])
        with scheduler_errors():
            self.dlsched.set_priority(job_id, priority)
        self.send(self.job_json(job_id))

    @staticmethod
    def priority(value: Any) -> int | str:
        """A priority as openapi.json describes it: a JSON integer within the bound, or a name.

        Stricter than ``parse_priority`` on purpose: a JSON client has numbers, so a
        number in a string (or a float, or " High ") is a mistake worth naming, and
        what is accepted is exactly what the schema says.
        """
        if isinstance(value, int) and not isinstance(value, bool):
            if -MAX_PRIORITY <= value <= MAX_PRIORITY:
                return value
        elif isinstance(value, str) and value in PRIORITY_NAMES:
            return value
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
        # the same words as the Python API's SpecError, with the value cut short
        raise ApiError(400, f"priority={shown} is invalid: expected {PRIORITY_HELP}")


class CancelHandler(DlschedHandler):
    @tornado.web.authenticated
    def post(self, job_id: str) -> None:
        job_id = self.job_id(job_id)
        with scheduler_errors():
            self.dlsched.cancel(job_id)
        self.send(self.job_json(job_id))


class RequeueHandler(DlschedHandler):
    @tornado.web.authenticated
    def post(self, job_id: str) -> None:
        """A new job with the finished job's spec: 201 and ``{"job": <the new job>}``; 409
        for a job that has not ended."""
        job_id = self.job_id(job_id)
        with scheduler_errors():
            new_id = self.dlsched.requeue(job_id)
        self.send({"job": self.job_json(new_id)}, status=201)


class LogHandler(DlschedHandler):
    @tornado.web.authenticated
    def get(self, job_id: str) -> None:
        job_id = self.job_id(job_id)
        self.job_json(job_id)  # 404 for an unknown job
        offset = self.int_arg("offset", None, low=0, high=MAX_OFFSET)
        tail = self.int_arg("tail", None, low=0, high=MAX_TAIL)
        max_bytes = self.int_arg("max_bytes", MAX_CHUNK, low=1, high=MAX_CHUNK)
        if offset is not None and tail is not None:
            raise ApiError(400, "give offset or tail, not both")
        assert max_bytes is not None
        try:
            chunk = read_log(self.dlsched.log_path(job_id), offset, tail, max_bytes)
        except PermissionError:
            owner = self.dlsched.scheduler.info(job_id).owner
            raise ApiError(
                403,
                f"job {job_id} belongs to {owner}: only its owner or a pool admin may read its log",
            ) from None
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


class PrometheusHandler(DlschedHandler):
    """``GET /dlsched/metrics``: the pool's metrics in Prometheus' text format (metrics.py).

    Authenticated like the rest of the API unless ``DlschedApp.open_metrics`` is set (for
    a scraper on this machine that holds no token).
    """

    def check_xsrf_cookie(self) -> None:
        return None  # GET only: nothing to forge

    async def prepare(self) -> None:  # type: ignore[override]
        if not self.settings.get("dlsched_open_metrics"):
            await super().prepare()

    def get(self) -> None:
        if not self.settings.get("dlsched_open_metrics") and not self.current_user:
            raise tornado.web.HTTPError(403)
        from ..machine.metrics import CONTENT_TYPE

        body = self.dlsched.metrics()
        self.set_header("Cache-Control", "no-store")
        self.finish(body, set_content_type=CONTENT_TYPE)


_ID = r"(?P<job_id>[^/]+)"


#: The whole REST API (also described by openapi.json next to this file).
class AccountingHandler(DlschedHandler):
    @tornado.web.authenticated
    def get(self) -> None:
        since = self.float_arg("since", 7 * 86400.0)
        if not 1 <= since <= MAX_ACCOUNTING:
            raise ApiError(400, f"since must be a number of seconds from 1 to {MAX_ACCOUNTING}")
        self.send(self.dlsched.accounting(since))


HANDLERS: list[tuple[str, type[DlschedHandler]]] = [
    (f"{API_PREFIX}/status", StatusHandler),
    (f"{API_PREFIX}/pool", PoolHandler),
    (f"{API_PREFIX}/cache", CacheHandler),
    (f"{API_PREFIX}/jobs", JobsHandler),
    (f"{API_PREFIX}/jobs/{_ID}", JobHandler),
    (f"{API_PREFIX}/jobs/{_ID}/log", LogHandler),
    (f"{API_PREFIX}/jobs/{_ID}/cancel", CancelHandler),
    (f"{API_PREFIX}/jobs/{_ID}/requeue", RequeueHandler),
    (f"{API_PREFIX}/metrics", MetricsHandler),
    (f"{API_PREFIX}/accounting", AccountingHandler),
    ("/dlsched/metrics", PrometheusHandler),
]
