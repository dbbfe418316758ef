"""`crossbar ctl`: the admin API from a shell, as aligned tables or (`--json`) as it answered.

A separate, short-lived process, so plain blocking `urllib.request` is right here. Every
failure is one line on stderr and exit status 1: crossbar unreachable, or its error message.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from crossbar.cli.client import DEFAULT_ADMIN, AdminClient, CtlError, seg
from crossbar.cli.format import ago, table, when
from crossbar.config import parse_duration

USAGE_BY = ("route", "host", "model", "key")

# -- subcommands -----------------------------------------------------------------------------
# Each returns (the API's JSON, the text for people).


def _hosts(c: AdminClient, a: argparse.Namespace) -> tuple[Any, str]:
    answer = c.call("GET", "/api/hosts")
    rows = []
    for h in answer["hosts"]:
        health = "healthy" if h["healthy"] else "UNHEALTHY"
        for m in h["models"]:
            slots = f"{m['in_flight']}/{m.get('share', m['parallel'])}"
            if m.get("share", m["parallel"]) != m["parallel"]:  # other instances hold the rest
                slots += f" of {m['parallel']}"
            waiting = ",".join(f"{r}={n}" for r, n in m.get("queued_by_route", {}).items())
            rows.append([h["name"], health, h["draining"], m["name"], m.get("state") or "-",
                         slots, m["queued"], m["leases"], m["ctx"], waiting or None,
                         h["reason"]])  # fmt: skip
    heads = ["HOST", "HEALTH", "DRAINING", "MODEL", "STATE", "SLOTS", "QUEUED", "LEASES", "CTX",
             "WAITING", "REASON"]  # fmt: skip
    if not any(h.get("router") for h in answer["hosts"]):  # no router-mode host: no states
        heads.remove("STATE")
        rows = [row[:4] + row[5:] for row in rows]
    text = table(heads, rows)
    for h in answer["hosts"]:
        router = h.get("router")
        if router:
            places = router["max_loaded"] if router["max_loaded"] is not None else "unknown"
            running = ", ".join(router["running"]) or "none"
            text += f"\n{h['name']}: router holding {places} model(s) at once; running {running}"
    return answer, text


def _pages(c: AdminClient, path: str, key: str, a: argparse.Namespace, **query: Any) -> Any:
    """One page of `path` (or, with --all, every page, followed by cursor) and a last line
    saying how many of how many were shown and how to ask for the next page."""
    limit = 1000 if a.all else a.limit
    answer = c.call("GET", path, limit=limit, cursor=a.cursor, **query)
    while a.all and answer["next"]:
        more = c.call("GET", path, limit=limit, cursor=answer["next"], **query)
        answer = {**more, key: answer[key] + more[key]}
    footer = f"{len(answer[key])} of {answer['total']}"
    if answer["next"]:
        footer += f"; next page: --cursor {answer['next']} (or --all)"
    return answer, footer


def _leases(c: AdminClient, a: argparse.Namespace) -> tuple[Any, str]:
    query = {"route": a.route, "host": a.host, "model": a.model, "fp": a.fp}
    answer, footer = _pages(c, "/api/leases", "leases", a, **query)
    rows = [[x["route"], x["fp"] or "(route)", x["model"], x["host"], ago(x["idle_for"])]
            for x in answer["leases"]]  # fmt: skip
    return answer, table(["ROUTE", "FP", "MODEL", "HOST", "IDLE"], rows) + f"\n{footer} leases"


def _routes(c: AdminClient, a: argparse.Namespace) -> tuple[Any, str]:
    query = {"route": a.search, "host": a.host, "model": a.model, "sort": a.sort}
    answer, footer = _pages(c, "/api/routes", "routes", a, **query)
    rows = []
    for r in answer["routes"]:
        source = ("template " + r["template"]) if r["template"] else "config"
        weight = r.get("weight")
        rows.append([r["name"], source if r["served"] else "not in config",
                     ",".join(r["hosts"]), r["pinned"], r["leases"], r["requests"],
                     r.get("priority"), "shared" if weight is None else f"{weight:g}",
                     r.get("max_in_flight"), r.get("max_queued"), r.get("in_flight"),
                     r.get("queued")])  # fmt: skip
    heads = ["ROUTE", "FROM", "HOSTS", "PINNED", "LEASES", "REQUESTS_24H", "PRIORITY", "WEIGHT",
             "MAX_IN_FLIGHT", "MAX_QUEUED", "IN_FLIGHT", "QUEUED"]  # fmt: skip
    return answer, table(heads, rows) + f"\n{footer} routes"


def _paging(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--host", help=f"only {what} on this host")
    p.add_argument("--model", help=f"only {what} of this model")
    p.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    p.add_argument("--cursor", help="the page after this cursor (printed under a page)")
    p.add_argument("--all", action="store_true", help="every page")


def _pin(c: AdminClient, a: argparse.Namespace) -> tuple[Any, str]:
    answer = c.call("PUT", f"/api/routes/{seg(a.route)}/pin", {"host": a.host})
    text = f"route {a.route} pinned to {a.host}"
    if not answer.get("healthy", True):
        text += f" (warning: {a.host} is unhealthy; the route's requests get 503 until it is back)"
    return answer, text


def _unpin(c: AdminClient, a: argparse.Namespace) -> tuple[Any, str]:
    answer = c.call("DELETE", f"/api/routes/{seg(a.route)}/pin")
    was = answer.get("unpinned")
    if was is None:
        return answer, f"route {a.route} was not pinned"
    return answer, f"route {a.route} unpinned (was {was})"


def _release(c: AdminClient, a: argparse.Namespace) -> tuple[Any, str]:
    answer = c.call("DELETE", f"/api/routes/{seg(a.route)}/leases")
    return answer, f"released {answer['released']} lease(s) of route {a.route}"


def _drain(c: AdminClient, a: argparse.Namespace) -> tuple[Any, str]:
    body = None if a.grace is None else {"grace": a.grace}
    answer = c.call("POST", f"/api/hosts/{seg(a.host)}/drain", body)
    said = f"host {a.host} is draining: it keeps its leases and gets no new ones"
    if a.grace is None:
        return answer, said
    if answer.get("stopped"):
        return answer, said + f"; {answer['stopped']} running answers moved to other hosts"
    running = answer.get("streaming", 0)
    return answer, said + (
        f"; its running answers ({running} now) move to other hosts in {a.grace} "
        "unless it is undrained before"
    )


def _undrain(c: AdminClient, a: argparse.Namespace) -> tuple[Any, str]:
    answer = c.call("DELETE", f"/api/hosts/{seg(a.host)}/drain")
    return answer, f"host {a.host} takes new leases again"


def _evacuate(c: AdminClient, a: argparse.Namespace) -> tuple[Any, str]:
    from crossbar.cli.evacuate import evacuate  # it builds on this module

    return evacuate(c, a)


def _model(c: AdminClient, a: argparse.Namespace) -> tuple[Any, str]:
    """`load` or `unload` (a.action) a router-mode host's model."""
    answer = c.call("POST", f"/api/hosts/{seg(a.host)}/models/{seg(a.model)}/{a.action}")
    return answer, f"host {a.host} model {a.model}: {answer['state']}"


def _model_events(c: AdminClient, a: argparse.Namespace) -> tuple[Any, str]:
    answer = c.call("GET", "/api/models/events", host=a.host, model=a.model, limit=a.limit)
    rows = [[when(e["at"]), e["host"], e["model"], e["kind"], e["reason"]]
            for e in answer["events"]]  # fmt: skip
    return answer, table(["AT", "HOST", "MODEL", "EVENT", "REASON"], rows)


def _events(c: AdminClient, a: argparse.Namespace) -> tuple[Any, str]:
    answer = c.call("GET", "/api/events", route=a.route, limit=a.limit, since=a.since)
    rows = [[when(e["at"]), e["reason"], e["route"],
             e["fp"] or ("(route)" if e["model"] else "(pin)"), e["model"],
             e["from_host"] or "-", e["to_host"] or "-"] for e in answer["events"]]  # fmt: skip
    return answer, table(["AT", "REASON", "ROUTE", "FP", "MODEL", "FROM", "TO"], rows)


def _usage(c: AdminClient, a: argparse.Namespace) -> tuple[Any, str]:
    answer = c.call("GET", "/api/usage", by=a.by, since=a.since)
    rows = []
    for u in answer["usage"]:
        ratio = u["cache_hit_ratio"]
        hit = "-" if ratio is None else f"{100 * ratio:.1f}%"
        rows.append([u[a.by], u["requests"], u["errors"], u["prompt_tokens"], u["cached_tokens"],
                     u["completion_tokens"], hit, u["ttfb_p50_ms"], u["ttfb_p95_ms"]])  # fmt: skip
    heads = [a.by.upper(), "REQUESTS", "ERRORS", "PROMPT", "CACHED", "COMPLETION", "CACHE HIT",
             "TTFB P50 MS", "TTFB P95 MS"]  # fmt: skip
    return answer, table(heads, rows)


def _series(c: AdminClient, a: argparse.Namespace) -> tuple[Any, str]:
    answer = c.call("GET", "/api/usage/series", since=a.since, bucket=a.bucket)
    rows = [[when(b["at"]), b["route"], b["requests"], b["prompt_tokens"], b["cached_tokens"],
             b["completion_tokens"]] for b in answer["series"]]  # fmt: skip
    return answer, table(["AT", "ROUTE", "REQUESTS", "PROMPT", "CACHED", "COMPLETION"], rows)


def _reload(c: AdminClient, a: argparse.Namespace) -> tuple[Any, str]:
    answer = c.call("POST", "/api/reload")
    lines = [f"config reloaded from {answer.get('path') or '(memory)'}"]
    lines += [f"  note: {note}" for note in answer.get("notes", [])]
    return answer, "\n".join(lines)


def _instances(c: AdminClient, a: argparse.Namespace) -> tuple[Any, str]:
    answer = c.call("GET", "/api/instances")
    rows = []
    for i in answer["instances"]:
        state = "alive" if i["alive"] else "DEAD"
        config = i["config_digest"] if i["config_matches"] else f"{i['config_digest']} (DIFFERS)"
        rows.append([i["id"] + (" *" if i["this"] else ""), state, i["address"], i["version"],
                     config, when(i["started"]), ago(i["seconds_since_heartbeat"]),
                     i["in_flight"]])  # fmt: skip
    heads = ["INSTANCE", "STATE", "ADDRESS", "VERSION", "CONFIG", "STARTED", "HEARTBEAT",
             "IN_FLIGHT"]  # fmt: skip
    return answer, table(heads, rows) + "\n(* the instance that answered)"


def _key_row(k: dict[str, Any]) -> list[Any]:
    limits, used = k["limits"], k.get("used", {})
    state = "BLOCKED" if k["blocked"] else "EXPIRED" if k["expired"] else "ok"
    set_limits = ",".join(
        f"{name}={limits[name]}"
        for name in ("rpm", "tpm", "max_in_flight", "tokens_per_day", "tokens_per_month")
        if limits.get(name) is not None
    )
    limited = sum(used.get("limited", {}).values())
    return [k["name"], state, ",".join(k["routes"]), ",".join(k["models"]) or "*",
            set_limits or "-", used.get("tokens_today"), used.get("tokens_this_month"),
            limited, k["source"]]  # fmt: skip


_KEY_HEADS = ["KEY", "STATE", "ROUTES", "MODELS", "LIMITS", "TOKENS_TODAY", "TOKENS_MONTH",
              "LIMITED", "FROM"]  # fmt: skip


def _keys_list(c: AdminClient, a: argparse.Namespace) -> tuple[Any, str]:
    answer = c.call("GET", "/api/keys")
    return answer, table(_KEY_HEADS, [_key_row(k) for k in answer["keys"]])


def _keys_show(c: AdminClient, a: argparse.Namespace) -> tuple[Any, str]:
    answer = c.call("GET", f"/api/keys/{seg(a.name)}")
    used = answer["used"]
    lines = [table(_KEY_HEADS, [_key_row(answer)]), "",
             f"in flight {used['in_flight']}; tokens this minute {used['tokens_this_minute']}; "
             f"today {used['tokens_today']}; this month {used['tokens_this_month']}"]  # fmt: skip
    if used["limited"]:
        lines.append("refused: " + ", ".join(f"{k} {n}" for k, n in used["limited"].items()))
    if answer.get("previous_secret_valid_until"):
        lines.append(f"previous secret valid until {when(answer['previous_secret_valid_until'])}")
    return answer, "\n".join(lines)


def _keys_create(c: AdminClient, a: argparse.Namespace) -> tuple[Any, str]:
    body: dict[str, Any] = {"name": a.name, "routes": a.route, "models": a.model or []}
    for name in ("rpm", "tpm", "max_in_flight", "tokens_per_day", "tokens_per_month"):
        if getattr(a, name) is not None:
            body[name] = getattr(a, name)
    if a.cached_weight is not None:
        body["cached_weight"] = a.cached_weight
    if a.weight is not None:
        body["weight"] = a.weight
    if a.expires:
        body["expires"] = a.expires
    answer = c.call("POST", "/api/keys", body)
    return answer, (f"key {a.name} created; its secret (shown this once):\n{answer['secret']}")


def _keys_block(c: AdminClient, a: argparse.Namespace) -> tuple[Any, str]:
    answer = c.call("POST", f"/api/keys/{seg(a.name)}/block")
    return answer, f"key {a.name} is blocked: every instance answers it 401"


def _keys_unblock(c: AdminClient, a: argparse.Namespace) -> tuple[Any, str]:
    answer = c.call("DELETE", f"/api/keys/{seg(a.name)}/block")
    return answer, f"key {a.name} is unblocked"


def _keys_rotate(c: AdminClient, a: argparse.Namespace) -> tuple[Any, str]:
    answer = c.call("POST", f"/api/keys/{seg(a.name)}/rotate", {"grace": a.grace})
    old = f"the old one works for {a.grace} more" if answer["grace"] else "the old one is void"
    return answer, f"key {a.name} rotated ({old}); its new secret (shown this once):\n" + (
        answer["secret"]
    )


def _keys_delete(c: AdminClient, a: argparse.Namespace) -> tuple[Any, str]:
    answer = c.call("DELETE", f"/api/keys/{seg(a.name)}")
    return answer, f"key {a.name} deleted"


def _add_keys(cmds: Any, common: argparse.ArgumentParser) -> None:
    text = "named client keys: list, show, create, block, unblock, rotate, delete"
    keys = cmds.add_parser("keys", parents=[common], help=text, description=text)
    sub = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")

    def cmd(name: str, fn: Callable[..., tuple[Any, str]], help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=help, description=help)
        p.set_defaults(func=run, ctl=fn)
        if name != "list":
            p.add_argument("name")
        return p

    cmd("list", _keys_list, "every key, its limits and what it spent (never a secret)")
    cmd("show", _keys_show, "one key: limits, use this minute, day and month, refusals")
    p = cmd("create", _keys_create, "a new key; its secret is printed once")
    p.add_argument("--route", action="append", required=True,
                   help="a route (or glob) it may use; repeat for more")  # fmt: skip
    p.add_argument("--model", action="append", help="a model (or glob) it may use; default any")
    for name in ("rpm", "tpm", "max-in-flight", "tokens-per-day", "tokens-per-month"):
        p.add_argument(f"--{name}", type=int, default=None, dest=name.replace("-", "_"))
    p.add_argument("--cached-weight", type=float, default=None,
                   help="what a cached prompt token counts for (default 0.1)")  # fmt: skip
    p.add_argument("--weight", type=float, default=None, help="its share of its routes' slots")
    p.add_argument("--expires", help="a date or date-time (UTC unless it says): 2027-01-31")
    cmd("block", _keys_block, "refuse the key (401) on every instance")
    cmd("unblock", _keys_unblock, "accept the key again")
    p = cmd("rotate", _keys_rotate, "a new secret; the old one works for --grace")
    p.add_argument("--grace", default="0s", help='how long the old secret works ("1h")')
    cmd("delete", _keys_delete, "delete a key made through the API")


def _batch_row(b: dict[str, Any]) -> list[Any]:
    progress, tokens, eta = b["progress"], b["tokens"], b["eta_seconds"]
    return [b["id"], b["route"], b["key"] or "-", b["status"],
            f"{progress['ended']}/{progress['total']}", b["items"]["failed"], tokens["prompt"],
            tokens["completion"], None if eta is None else ago(eta),
            when(b["created_at"])]  # fmt: skip


_BATCH_HEADS = ["BATCH", "ROUTE", "KEY", "STATUS", "ENDED", "FAILED", "TOKENS_IN", "TOKENS_OUT",
                "ETA", "CREATED"]  # fmt: skip


def _batches_list(c: AdminClient, a: argparse.Namespace) -> tuple[Any, str]:
    query = {"route": a.route, "key": a.key, "status": a.status}
    limit = 1000 if a.all else a.limit
    answer = c.call("GET", "/api/batches", limit=limit, after=a.after, **query)
    while a.all and answer["next"]:
        more = c.call("GET", "/api/batches", limit=limit, after=answer["next"], **query)
        answer = {**more, "batches": answer["batches"] + more["batches"]}
    footer = f"{len(answer['batches'])} batches"
    if answer["next"]:
        footer += f"; next page: --after {answer['next']} (or --all)"
    return answer, table(_BATCH_HEADS, [_batch_row(b) for b in answer["batches"]]) + f"\n{footer}"


def _batches_show(c: AdminClient, a: argparse.Namespace) -> tuple[Any, str]:
    b = c.call("GET", f"/api/batches/{seg(a.id)}", limit=a.limit)
    items, tokens = b["items"], b["tokens"]
    files = ", ".join(f"{name} {b[name + '_file_id']}" for name in ("input", "output", "error")
                      if b[name + "_file_id"])  # fmt: skip
    lines = [table(_BATCH_HEADS, [_batch_row(b)]), "",
             f"{b['endpoint']}, window {b['completion_window']}; files: {files}",
             f"items: {items['pending']} pending, {items['running']} running, {items['done']} "
             f"done, {items['failed']} failed",
             f"tokens: {tokens['prompt']} prompt ({tokens['cached']} cached), "
             f"{tokens['completion']} completion"]  # fmt: skip
    for error in (b["errors"] or {}).get("data", []):
        where = f"line {error['line']}: " if error.get("line") else ""
        lines.append(f"error: {where}{error['code']}: {error['message']}")
    events = [[when(e["at"]), e["status"], e["instance"] or "-", e["detail"] or None]
              for e in b["events"]]  # fmt: skip
    lines += ["", table(["AT", "STATUS", "INSTANCE", "DETAIL"], events)]
    return b, "\n".join(lines)


def _batches_cancel(c: AdminClient, a: argparse.Namespace) -> tuple[Any, str]:
    b = c.call("POST", f"/api/batches/{seg(a.id)}/cancel")
    if b["status"] == "cancelling":
        running = b["items"]["running"]
        text = (f"batch {a.id} cancelling: its requests not run go to its error file; "
                f"{running} running finish first")  # fmt: skip
    else:
        text = f"batch {a.id} is {b['status']}: nothing to cancel"
    return b, text


def _add_batches(cmds: Any, common: argparse.ArgumentParser) -> None:
    text = "batches of every route and key: list (the default), show, cancel"
    batches = cmds.add_parser("batches", parents=[common], help=text, description=text)
    batches.set_defaults(func=run, ctl=_batches_list)
    batches.add_argument("--route", help="only this route's")
    batches.add_argument("--key", help="only this named key's")
    batches.add_argument("--status", help="only batches in this status (in_progress, ...)")
    batches.add_argument("--limit", type=int, default=100, help="at most this many (100)")
    batches.add_argument("--after", help="the page after this batch (printed under a page)")
    batches.add_argument("--all", action="store_true", help="every page")
    sub = batches.add_subparsers(dest="batches_command", metavar="[ACTION]")
    text = "one batch: its progress, items, tokens, errors and events"
    p = sub.add_parser("show", parents=[common], help=text, description=text)
    p.set_defaults(ctl=_batches_show)
    p.add_argument("id")
    p.add_argument("--limit", type=int, default=None,
                   help="at most this many events (default: the API's, 100)")  # fmt: skip
    text = "cancel a batch as its client would: what has not run ends in its error file"
    p = sub.add_parser("cancel", parents=[common], help=text, description=text)
    p.set_defaults(ctl=_batches_cancel)
    p.add_argument("id")


# -- the parser ------------------------------------------------------------------------------


def add_parser(sub: Any) -> None:
    """Add `ctl` and its subcommands to the `crossbar` command's subparsers."""
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: given before or after the subcommand, an option is not reset by the other.
    common.add_argument(
        "--admin",
        default=argparse.SUPPRESS,
        help=f"admin API URL (env CROSSBAR_ADMIN, default {DEFAULT_ADMIN})",
    )
    common.add_argument(
        "--token", default=argparse.SUPPRESS, help="admin token (env CROSSBAR_ADMIN_TOKEN)"
    )
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print the API's JSON answer instead of a table")  # fmt: skip
    ctl = sub.add_parser("ctl", parents=[common], help="talk to a running crossbar's admin API")
    cmds = ctl.add_subparsers(dest="ctl_command", required=True, metavar="COMMAND")

    def cmd(name: str, fn: Callable[..., tuple[Any, str]], text: str) -> argparse.ArgumentParser:
        p = cmds.add_parser(name, parents=[common], help=text, description=text)
        p.set_defaults(func=run, ctl=fn)
        return p

    cmd("hosts", _hosts, "hosts: health, draining, slots, queue (and who waits), leases")
    p = cmd("leases", _leases, "the lease table, a page at a time (key order)")
    p.add_argument("--route", help="only this route")
    p.add_argument("--fp", help="only conversations whose fingerprint starts so")
    _paging(p, "leases")
    p = cmd("routes", _routes, "routes (configured and seen), pins, leases, queue shares")
    p.add_argument("--search", help="only routes whose name contains this")
    p.add_argument("--sort", choices=("name", "requests", "leases"), default=None,
                   help="name (the default), or most requests (24 h) or leases first")  # fmt: skip
    _paging(p, "routes")
    p = cmd("pin", _pin, "send every request of ROUTE to HOST (one of its configured hosts)")
    p.add_argument("route")
    p.add_argument("host")
    cmd("unpin", _unpin, "remove ROUTE's pin; its leases stay").add_argument("route")
    cmd("release", _release, "drop every lease of ROUTE").add_argument("route")
    p = cmd("drain", _drain, "HOST keeps its leases and gets no new ones")
    p.add_argument("host")
    p.add_argument("--grace", type=_duration, default=None,
                   help='then, after this long ("30s"), stop its running streamed answers '
                   "and continue each on another host")  # fmt: skip
    cmd("undrain", _undrain, "HOST takes new leases again").add_argument("host")
    p = cmd("evacuate", _evacuate, "drain HOST and move its conversations away, prewarmed")
    p.add_argument("host")
    p.add_argument("--no-wait", action="store_true", help="start it and return")
    p.add_argument("--now", action="store_true",
                   help="also stop its running streamed answers and continue each on its "
                   "conversation's new host")  # fmt: skip
    for action, text in (
        ("load", "router-mode HOST loads MODEL (through the router's own API)"),
        ("unload", "router-mode HOST unloads MODEL; its conversations there go cold"),
    ):
        p = cmd(action, _model, text)
        p.set_defaults(action=action)
        p.add_argument("host")
        p.add_argument("model")
    p = cmd("model-events", _model_events, "model loads and unloads on router-mode hosts")
    p.add_argument("--host", help="only this host")
    p.add_argument("--model", help="only this model")
    p.add_argument("--limit", type=int, default=None,
                   help="at most this many (default: the API's, 100)")  # fmt: skip
    p = cmd("events", _events, "lease events, newest first")
    p.add_argument("--route", help="only this route")
    p.add_argument("--limit", type=int, default=None,
                   help="at most this many (default: the API's, 100)")  # fmt: skip
    p.add_argument("--since", help='a duration ("1h") or seconds since the epoch')
    p = cmd("usage", _usage, "requests, errors, tokens, cache hits and TTFB")
    p.add_argument("--by", choices=USAGE_BY, default="route", help="group by (default route)")
    p.add_argument("--since", help='a duration ("24h") or seconds since the epoch')
    p = cmd("usage-series", _series, "requests and tokens per route over time, oldest first")
    p.add_argument("--since", help='a duration ("1h", the default) or seconds since the epoch')
    p.add_argument("--bucket", help='the width of each point ("1m", the default)')
    cmd("instances", _instances, "the crossbar instances sharing this one's store")
    _add_keys(cmds, common)
    _add_batches(cmds, common)
    cmd("reload", _reload, "reload the config file; a bad file is refused with every error")
    text = "a refreshing view: hosts' slots and queues, requests/s and cache hits per route, moves"
    p = cmds.add_parser("top", parents=[common], help=text, description=text + "; q quits")
    p.set_defaults(func=_top)
    p.add_argument("--interval", type=_seconds, default=2.0, help="seconds between refreshes")
    p.add_argument(
        "--window", type=_seconds, default=60.0, help="seconds of traffic requests/s cover"
    )
    p.add_argument("--once", action="store_true", help="print one frame and exit")


def _duration(text: str) -> str:
    """A duration option as given ("30s"), refused here when it is not one."""
    try:
        parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < 86400 * 30:
        raise argparse.ArgumentTypeError(f"give a number of seconds above 0, not {text!r}")
    return value


def _top(args: argparse.Namespace) -> int:
    from crossbar.cli import top  # it builds on this module

    return top.run(_client(args), args.interval, args.window, args.once)


def _client(args: argparse.Namespace) -> AdminClient:
    base = getattr(args, "admin", None) or os.environ.get("CROSSBAR_ADMIN") or DEFAULT_ADMIN
    token = getattr(args, "token", None) or os.environ.get("CROSSBAR_ADMIN_TOKEN", "")
    return AdminClient(base, token)


def run(args: argparse.Namespace) -> int:
    """Run one ctl subcommand; 0 on success, 1 (and one line on stderr) on failure."""
    client = _client(args)
    try:
        answer, text = args.ctl(client, args)
    except CtlError as e:
        print(f"crossbar ctl: {e}", file=sys.stderr)
        return 1
    print(json.dumps(answer, indent=2) if getattr(args, "json", False) else text)
    return 0
