"""`scalebench webhook add | list | enable | disable | events | delete | deliveries`: webhooks notified on
regression events (POST/GET /webhooks, PATCH and DELETE /webhooks/{id}, GET /webhooks/{id}/deliveries; every
one needs a token). The server refuses URLs of loopback, link-local, private, unspecified and multicast
addresses and URLs with credentials, unless its operator set SCALEBENCH_WEBHOOK_ALLOW_PRIVATE=1."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from cli.client import ApiClient
from cli.runs import ServerOpt, TokenOpt, cli_errors, console, utc_time

app = typer.Typer(help="Webhooks: a signed JSON POST on regression events.", no_args_is_help=True)
WebhookIdArg = Annotated[int, typer.Argument(help="Webhook id (from `scalebench webhook list`).")]
EVENTS = (
    "regression.suspected",
    "regression.confirmed",
    "regression.failed",
    "regression.recovered",
    "regression.improved",
)


def _show(hook: dict) -> None:
    state = "enabled" if hook["enabled"] else "disabled"
    console.print(f"webhook {hook['id']} -> {hook['url']} ({state}; events: {', '.join(hook['events'])})")


@app.command("add")
@cli_errors
def add(
    url: Annotated[str, typer.Argument(help="http(s) URL of the receiver (a public address).")],
    event: Annotated[
        list[str] | None,
        typer.Option(
            "--event", help=f"Event to send (repeat); one of {', '.join(EVENTS)}. Default: regression.confirmed."
        ),
    ] = None,
    secret: Annotated[str | None, typer.Option(help="HMAC key (16+ characters); generated when absent.")] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """Register a webhook; prints its secret once (verify X-Scalebench-Signature with it)."""
    body: dict = {"url": url} | ({"events": event} if event else {}) | ({"secret": secret} if secret else {})
    with ApiClient(server, token) as client:
        hook = client.post("/webhooks", json=body)
    _show(hook)
    console.print(f"secret (shown once): {hook['secret']}")


@app.command("list")
@cli_errors
def list_webhooks(server: ServerOpt = None, token: TokenOpt = None) -> None:
    """Webhooks: id, redacted URL, events, enabled."""
    with ApiClient(server, token) as client:
        rows = client.get("/webhooks")
    table = Table("id", "url", "events", "enabled", "created (UTC)")
    for r in rows:
        table.add_row(
            str(r["id"]), r["url"], ", ".join(r["events"]), "yes" if r["enabled"] else "no", utc_time(r["created_at"])
        )
    console.print(table)


def _patch(webhook_id: int, body: dict, server: str | None, token: str | None) -> None:
    with ApiClient(server, token) as client:
        _show(client.request("PATCH", f"/webhooks/{webhook_id}", json=body).json())


@app.command("enable")
@cli_errors
def enable(webhook_id: WebhookIdArg, server: ServerOpt = None, token: TokenOpt = None) -> None:
    """Send this webhook's events again (from the next finding on)."""
    _patch(webhook_id, {"enabled": True}, server, token)


@app.command("disable")
@cli_errors
def disable(webhook_id: WebhookIdArg, server: ServerOpt = None, token: TokenOpt = None) -> None:
    """Stop sending: pending deliveries end as failed ("webhook disabled")."""
    _patch(webhook_id, {"enabled": False}, server, token)


@app.command("events")
@cli_errors
def events(
    webhook_id: WebhookIdArg,
    event: Annotated[list[str], typer.Argument(help=f"Events to send: {', '.join(EVENTS)}.")],
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """Replace the events a webhook is sent."""
    _patch(webhook_id, {"events": event}, server, token)


@app.command("delete")
@cli_errors
def delete(webhook_id: WebhookIdArg, server: ServerOpt = None, token: TokenOpt = None) -> None:
    """Delete a webhook and its delivery log."""
    with ApiClient(server, token) as client:
        client.request("DELETE", f"/webhooks/{webhook_id}")
    console.print(f"deleted webhook {webhook_id}")


@app.command("deliveries")
@cli_errors
def deliveries(
    webhook_id: WebhookIdArg,
    limit: Annotated[int, typer.Option(min=1, max=500, help="Newest first, at most this many.")] = 20,
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """A webhook's deliveries: event, status, attempts, last status code or error."""
    with ApiClient(server, token) as client:
        rows = client.get(f"/webhooks/{webhook_id}/deliveries", limit=limit)
    table = Table("id", "event", "status", "attempts", "last answer", "created (UTC)")
    for r in rows:
        answer = str(r["status_code"]) if r["status_code"] and not r["error"] else (r["error"] or "-")
        table.add_row(str(r["id"]), r["event"], r["status"], str(r["attempt"]), answer, utc_time(r["created_at"]))
    console.print(table)
