"""The dashboard's pages and actions, each a thin call of `flexiq_plugins.operations` (C52).

Pages (``GET``) read: the overview, the runs with their filters, a run's step
timeline, the dead letters and a dead letter's divergence, the events. Every
action (``POST``) is checked in one order before it does anything: refused in
read-only mode, then refused without this browser's CSRF token, then refused
unless authorized (the host's ``authorize``, or the token); then it calls the
same operations function the ``flexiq`` command calls, and shows what it did.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs, quote, urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from ..errors import UnknownRun
from ..operations import (
    RunFilter,
    browse_dead_letters,
    browse_events,
    browse_runs,
    bulk_cancel,
    bulk_retry,
    cancel_run,
    divergence_of,
    fork_run,
    overview,
    parse_moment,
    plan_bulk,
    purge_dead_letters,
    recover,
    retry_dead_letter,
    run_timeline,
    send_event,
    show_run,
)
from ._render import Dashboard, page, render
from ._security import SESSION_COOKIE

__all__ = ["routes"]

STATUSES = ("queued", "pending", "running", "sleeping", "waiting", "retrying")
FINISHED = ("succeeded", "failed", "dead", "cancelled", "compensated")
FILTER_FIELDS = ("status", "task", "framework", "queue", "since", "until")
_MAX_FORM_BYTES = 64 * 1024


def _board(request: Request) -> Dashboard:
    board: Dashboard = request.app.state.dashboard
    return board


# ------------------------------------------------------------------- pages
@page
async def overview_page(request: Request) -> Response:
    """The overview: runs by status and task, runs that may be stuck, the last day's dead letters, recovery."""
    board = _board(request)
    return render(request, "overview.html", view=overview(board.store, cap=board.count_cap), nav="overview")


@page
async def overview_live(request: Request) -> Response:
    """The overview's counts alone, for the page's periodic refresh (htmx)."""
    board = _board(request)
    return render(request, "_overview_counts.html", view=overview(board.store, cap=board.count_cap))


def _filters(request: Request) -> dict[str, str]:
    """The runs filter as given in the query (empty fields left out)."""
    return {
        name: request.query_params[name].strip() for name in FILTER_FIELDS if request.query_params.get(name, "").strip()
    }


def _run_filter(board: Dashboard, fields: dict[str, str]) -> RunFilter:
    now = board.store.now() if ("since" in fields or "until" in fields) else 0.0
    return RunFilter(
        status=fields.get("status"),
        task_name=fields.get("task"),
        framework=fields.get("framework"),
        queue=fields.get("queue"),
        updated_since=parse_moment(fields["since"], now) if "since" in fields else None,
        updated_until=parse_moment(fields["until"], now) if "until" in fields else None,
    )


@page
async def runs_page(request: Request) -> Response:
    """The runs: filters, search by run key or job id, keyset pages, newest or oldest update first."""
    board = _board(request)
    fields = _filters(request)
    search = request.query_params.get("q", "").strip()
    if search:
        try:
            found = show_run(board.store, search)
        except UnknownRun as exc:
            return render(
                request, "runs.html", 404, fields=fields, search=search, missing=str(exc), nav="runs", page=None
            )
        return RedirectResponse(f"{request.scope.get('root_path', '')}/runs/{_segment(found.run.run_key)}", 303)
    oldest = request.query_params.get("order") == "oldest"
    listing = browse_runs(
        board.store,
        _run_filter(board, fields),
        cursor=request.query_params.get("cursor") or None,
        order="updated_asc" if oldest else "updated_desc",
    )
    return render(
        request,
        "runs.html",
        page=listing,
        nav="runs",
        search="",
        statuses=STATUSES + FINISHED,
        fields=fields,
        order="updated_asc" if oldest else "updated_desc",
        query=urlencode({**fields, **({"order": "oldest"} if oldest else {})}),
    )


def _segment(text: str) -> str:
    return quote(text, safe="")


@page
async def run_page(request: Request) -> Response:
    """A run: its fields, arguments (on request), step timeline, dead letters and outcome."""
    board = _board(request)
    values = request.query_params.get("values") == "1"
    timeline = run_timeline(board.store, request.path_params["run_key"], values=values, codec=board.codec)
    return render(request, "run.html", timeline=timeline, run=timeline.run, values=values, nav="runs")


@page
async def run_status(request: Request) -> Response:
    """A run's status block alone, for the run page's periodic refresh (htmx)."""
    board = _board(request)
    timeline = run_timeline(board.store, request.path_params["run_key"], codec=board.codec)
    return render(request, "_run_status.html", timeline=timeline, run=timeline.run)


def _flag(request: Request, name: str) -> bool | None:
    value = request.query_params.get(name, "")
    return {"yes": True, "no": False}.get(value)


@page
async def dead_letters_page(request: Request) -> Response:
    """The dead letters, newest first, by task, reason and whether retried."""
    board = _board(request)
    params = request.query_params
    fields = {k: params[k].strip() for k in ("task", "reason", "retried") if params.get(k, "").strip()}
    before = params.get("before")
    listing = browse_dead_letters(
        board.store,
        task_name=fields.get("task"),
        reason=fields.get("reason"),
        retried=_flag(request, "retried"),
        before_id=int(before) if before and before.isdigit() else None,
    )
    return render(request, "dead_letters.html", page=listing, fields=fields, query=urlencode(fields), nav="dead")


@page
async def dead_letter_page(request: Request) -> Response:
    """A dead letter: its reason, message and traceback, its divergence as a diff, the job to re-publish."""
    board = _board(request)
    dead = board.store.get_dead_letter(request.path_params["dead_letter_id"])
    try:
        steps = board.store.get_steps(dead.run_key)
        run = board.store.get_run(dead.run_key)
    except UnknownRun:
        steps, run = [], None
    return render(
        request, "dead_letter.html", dead=dead, run=run, steps=steps, divergence=divergence_of(dead), nav="dead"
    )


@page
async def events_page(request: Request) -> Response:
    """The events, newest first: pending ones and received ones, with the runs that received each."""
    board = _board(request)
    state = request.query_params.get("state", "")
    received = {"pending": False, "received": True}.get(state)
    before = request.query_params.get("before")
    listing = browse_events(
        board.store, received=received, before_id=int(before) if before and before.isdigit() else None
    )
    return render(request, "events.html", page=listing, state=state if received is not None else "", nav="events")


@page
async def bulk_page(request: Request) -> Response:
    """A bulk action's confirmation: how many runs the current filter selects and which it would touch."""
    board = _board(request)
    action = request.path_params["action"]
    fields = _filters(request)
    plan = plan_bulk(board.store, action, _run_filter(board, fields))
    return render(request, "confirm.html", plan=plan, fields=fields, query=urlencode(fields), nav="runs")


# ---------------------------------------------------------------- sign-in
@page
async def signin_page(request: Request) -> Response:
    """The sign-in form, where a person gives the dashboard's token."""
    return render(request, "signin.html", failed=False, nav="")


@page
async def signin(request: Request) -> Response:
    """Check the CSRF token and the dashboard's token; on success set the session cookie."""
    board = _board(request)
    form = await _form(request)
    if not board.guard.csrf_ok(request, form.get("csrf_token")):
        return _refused(request, "the form's CSRF token is missing or stale: reload the page and try again")
    if not board.guard.uses_token or not board.guard.token_ok(form.get("token", "")):
        return render(request, "signin.html", 403, failed=True, nav="")
    root = request.scope.get("root_path", "")
    response = RedirectResponse(f"{root}/", 303)
    response.set_cookie(SESSION_COOKIE, board.guard.session_value(), httponly=True, samesite="strict", path=root or "/")
    return response


@page
async def signout(request: Request) -> Response:
    """Forget the session cookie."""
    board = _board(request)
    form = await _form(request)
    if not board.guard.csrf_ok(request, form.get("csrf_token")):
        return _refused(request, "the form's CSRF token is missing or stale: reload the page and try again")
    root = request.scope.get("root_path", "")
    response = RedirectResponse(f"{root}/", 303)
    response.delete_cookie(SESSION_COOKIE, path=root or "/")
    return response


# ----------------------------------------------------------------- actions
async def _form(request: Request) -> dict[str, str]:
    """The POSTed form (``application/x-www-form-urlencoded``), first value of each field."""
    body = await request.body()
    if len(body) > _MAX_FORM_BYTES:
        raise ValueError(f"the form is larger than {_MAX_FORM_BYTES} bytes")
    parsed = parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True)
    return {name: values[0] for name, values in parsed.items()}


def _refused(request: Request, why: str) -> Response:
    return render(request, "error.html", 403, title="Refused", message=why)


async def _checked(request: Request, action: str) -> dict[str, str] | Response:
    """The form of an allowed action, or the page refusing it: read-only, then CSRF, then authorization."""
    board = _board(request)
    if board.guard.read_only:
        return _refused(request, "this dashboard is read-only: it performs no action")
    form = await _form(request)
    if not board.guard.csrf_ok(request, form.get("csrf_token")):
        return _refused(request, "the form's CSRF token is missing or stale: reload the page and try again")
    if not board.guard.may(request, action):
        why = "sign in with the dashboard's token to act" if board.guard.uses_token else "you may not do that here"
        return _refused(request, f"not authorized to {action.replace('_', ' ')}: {why}")
    return form


def _done(request: Request, title: str, lines: list[str], back: str, failed: list[str] | None = None) -> Response:
    return render(request, "result.html", title=title, lines=lines, failed=failed or [], back=back, nav="")


@page
async def retry_action(request: Request) -> Response:
    """Retry a dead letter, optionally from a chosen step (``dlq retry --reset-from``)."""
    form = await _checked(request, "retry")
    if isinstance(form, Response):
        return form
    board = _board(request)
    dead_letter_id = request.path_params["dead_letter_id"]
    reset_from = form.get("reset_from") or None
    done = retry_dead_letter(board.store, dead_letter_id, board.publishers, reset_from=reset_from)
    line = f"retried dead letter {done.dead_letter_id}: run {done.run_key} -> {done.framework} job {done.job_id}"
    return _done(request, "Retried", [line], f"/runs/{_segment(done.run_key)}")


@page
async def purge_action(request: Request) -> Response:
    """Delete a dead letter (its run stays until cleanup)."""
    form = await _checked(request, "purge")
    if isinstance(form, Response):
        return form
    count = purge_dead_letters(_board(request).store, [request.path_params["dead_letter_id"]])
    return _done(request, "Purged", [f"purged {count} dead letter{'s' if count != 1 else ''}"], "/dead-letters")


@page
async def cancel_action(request: Request) -> Response:
    """Cancel a run (``runs cancel``): at once unless an attempt runs it; its undos run."""
    form = await _checked(request, "cancel")
    if isinstance(form, Response):
        return form
    board = _board(request)
    run_key = request.path_params["run_key"]
    done = cancel_run(run_key, reason=form.get("reason", ""), store=board.store, publishers=board.publishers)
    said = {
        "cancelled": "cancelled",
        "compensating": "cancelled; its undos run next"
        + (f" (job {done.job_id})" if done.job_id else f" ({done.note})" if done.note else ""),
        "requested": "cancellation requested: its running attempt stops at its next step",
        "finished": f"already {done.status}: nothing to cancel",
    }
    return _done(request, "Cancel", [f"run {done.run_key}: {said[done.effect]}"], f"/runs/{_segment(run_key)}")


@page
async def fork_action(request: Request) -> Response:
    """Fork a run from a step (``runs fork``): a new run with the steps before it copied, published (C50)."""
    form = await _checked(request, "fork")
    if isinstance(form, Response):
        return form
    board = _board(request)
    from_step = form.get("from_step", "")
    done = fork_run(board.store, request.path_params["run_key"], from_step, board.publishers)
    copied = f"{done.copied} step row{'s' if done.copied != 1 else ''} copied"
    line = f"forked run {done.run_key} from {done.from_step}: new run {done.new_run_key} ({copied})"
    line += f" -> {done.framework} job {done.job_id}"
    return _done(request, "Forked", [line], f"/runs/{_segment(done.new_run_key)}")


@page
async def send_event_action(request: Request) -> Response:
    """Send an event (``events send``): stored first, then the runs waiting on it are woken."""
    form = await _checked(request, "send_event")
    if isinstance(form, Response):
        return form
    board = _board(request)
    data = form.get("data", "").strip()
    try:
        payload: Any = json.loads(data) if data else None
    except ValueError as exc:
        raise ValueError(f"the payload is not JSON: {exc}") from None
    run_key = form.get("run_key", "").strip() or None
    sent = send_event(
        form.get("topic", ""),
        form.get("key", ""),
        payload,
        run_key=run_key,
        store=board.store,
        publishers=board.publishers,
    )
    lines = [f"event {sent.event.id} ({sent.event.topic!r}, {sent.event.key!r}) sent"]
    lines += [f"woke run {run} as job {job}" for run, job in sent.woken]
    lines += [f"run {run} waits for it: left to recovery ({why})" for run, why in sent.left]
    return _done(request, "Event sent", lines, "/events")


@page
async def recover_action(request: Request) -> Response:
    """Run one recovery now (``flexiq recover``)."""
    form = await _checked(request, "recover")
    if isinstance(form, Response):
        return form
    board = _board(request)
    report = recover(board.store, board.publishers)
    lines = [
        f"re-published run {s.run.run_key} ({s.run.task_name}, {s.why}) as job {job}" for s, job in report.recovered
    ]
    lines += [f"skipped run {s.run.run_key} ({s.run.task_name}): {note}" for s, note in report.skipped]
    failed = [f"run {s.run.run_key}: {error}" for s, error in report.failed]
    return _done(request, "Recovery", lines or ["Nothing to recover."], "/", failed)


@page
async def bulk_action(request: Request) -> Response:
    """Retry or cancel the runs of a filter, after its confirmation page."""
    action = request.path_params["action"]
    if action not in ("retry", "cancel"):
        raise ValueError(f"no bulk action {action!r}; the bulk actions are retry and cancel")
    form = await _checked(request, f"bulk_{action}")
    if isinstance(form, Response):
        return form
    board = _board(request)
    fields = {name: form[name].strip() for name in FILTER_FIELDS if form.get(name, "").strip()}
    where = _run_filter(board, fields)
    if action == "retry":
        result = bulk_retry(board.store, where, board.publishers)
    else:
        result = bulk_cancel(board.store, where, board.publishers, reason=form.get("reason", ""))
    lines = [f"run {run_key}: {what}" for run_key, what in result.done] or ["No run was touched."]
    failed = [f"run {run_key}: {error}" for run_key, error in result.failed]
    return _done(request, f"Bulk {action}", lines, f"/runs?{urlencode(fields)}", failed)


def routes() -> list[Route]:
    """The dashboard's routes, relative to where it is mounted."""
    return [
        Route("/", overview_page, name="overview"),
        Route("/fragments/overview", overview_live, name="overview_live"),
        Route("/runs", runs_page, name="runs"),
        Route("/runs/{run_key:path}", run_page, name="run"),
        Route("/fragments/run-status/{run_key:path}", run_status, name="run_status"),
        Route("/dead-letters", dead_letters_page, name="dead_letters"),
        Route("/dead-letters/{dead_letter_id:int}", dead_letter_page, name="dead_letter"),
        Route("/events", events_page, name="events"),
        Route("/bulk/{action:str}", bulk_page, name="bulk"),
        Route("/signin", signin_page, name="signin"),
        Route("/signin", signin, methods=["POST"]),
        Route("/signout", signout, methods=["POST"], name="signout"),
        Route("/actions/retry/{dead_letter_id:int}", retry_action, methods=["POST"], name="retry"),
        Route("/actions/purge/{dead_letter_id:int}", purge_action, methods=["POST"], name="purge"),
        Route("/actions/cancel/{run_key:path}", cancel_action, methods=["POST"], name="cancel"),
        Route("/actions/fork/{run_key:path}", fork_action, methods=["POST"], name="fork"),
        Route("/actions/send-event", send_event_action, methods=["POST"], name="send_event"),
        Route("/actions/recover", recover_action, methods=["POST"], name="recover"),
        Route("/actions/bulk/{action:str}", bulk_action, methods=["POST"], name="bulk_action"),
    ]
