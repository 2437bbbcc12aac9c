"""Webhooks: notified on regression events (default: regression.confirmed) with a signed JSON POST."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Path, Query, Response

from api.deps import ReadAuth, SessionDep, WriteAuth
from api.guard import GuardedRoute
from api.nightly_schemas import DeliveryRead, WebhookCreate, WebhookCreated, WebhookRead
from api.problems import PROBLEM_RESPONSES, FieldError, ProblemError, found
from db import webhooks as q
from db.models_nightly import Webhook


def redacted_url(url: str) -> tuple[str, str]:
    """(scheme://host[:port]/***, host) of a stored webhook URL: no user info, path or query."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    shown = f"[{host}]" if ":" in host else host  # an IPv6 literal
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{shown}{port}/***", host


def webhook_read(hook: Webhook) -> dict[str, Any]:
    url, host = redacted_url(hook.url)
    return {"id": hook.id, "url": url, "host": host, "events": hook.events, "enabled": hook.enabled,
            "created_at": hook.created_at}


router = APIRouter(prefix="/webhooks", tags=["webhooks"], route_class=GuardedRoute)
WebhookId = Annotated[int, Path(ge=1, le=2**31 - 1, description="Webhook id.")]


@router.post("", status_code=201, response_model=WebhookCreated, responses=PROBLEM_RESPONSES,
             summary="Register a webhook (the secret is returned once)")
def create_webhook(body: WebhookCreate, session: SessionDep, _auth: WriteAuth, response: Response) -> Any:
    try:
        hook = q.create_webhook(session, body.url, secret=body.secret, events=body.events, enabled=body.enabled)
    except q.WebhookError as exc:
        raise ProblemError(
            422, str(exc), [FieldError(field=exc.field, message=exc.message, allowed=exc.allowed)]
        ) from exc
    session.commit()
    response.headers["Location"] = f"/webhooks/{hook.id}"
    return webhook_read(hook) | {"secret": hook.secret}


@router.get("", response_model=list[WebhookRead], responses=PROBLEM_RESPONSES, summary="List webhooks")
def list_webhooks(session: SessionDep, _auth: ReadAuth) -> Any:
    return [webhook_read(h) for h in q.list_webhooks(session)]


@router.get(
    "/{webhook_id}/deliveries",
    response_model=list[DeliveryRead],
    responses=PROBLEM_RESPONSES,
    summary="Delivery log of a webhook, newest first (every attempt with its status code or error)",
)
def list_deliveries(
    webhook_id: WebhookId, session: SessionDep, _auth: ReadAuth, limit: Annotated[int, Query(ge=1, le=500)] = 100
) -> Any:
    found(q.get_webhook(session, webhook_id), "webhook", webhook_id)
    return q.list_deliveries(session, webhook_id, limit)
