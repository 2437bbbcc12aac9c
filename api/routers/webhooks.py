"""Webhooks: notified on regression events (default: regression.confirmed) with a signed JSON POST.

Every route needs a token, reads included: a webhook's host and its delivery log are an operator's business.
URLs are checked by core.contracts.webhook_targets (public addresses only, unless settings.webhook_allow_private)."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Query, Response

import db.webhooks
from api.deps import AdminAuth, SessionDep, SettingsDep, WebhookId
from api.guard import GuardedRoute
from api.problems import PROBLEM_RESPONSES, WRITE_RESPONSES, FieldError, ProblemError, found
from api.schemas.nightly import DeliveryRead, WebhookCreate, WebhookCreated, WebhookRead, WebhookUpdate
from db.models import Webhook
from osutil.dns import system_resolve


def redacted_url(url: str) -> tuple[str, str]:
    """(scheme://host[:port]/***, host) of a stored webhook URL: no user info, path or query."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    shown = f"[{host}]" if ":" in host else host  # an IPv6 literal
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{shown}{port}/***", host


def webhook_read(hook: Webhook) -> dict[str, Any]:
    url, host = redacted_url(hook.url)
    return {
        "id": hook.id,
        "url": url,
        "host": host,
        "events": hook.events,
        "enabled": hook.enabled,
        "created_at": hook.created_at,
    }


router = APIRouter(prefix="/webhooks", tags=["webhooks"], route_class=GuardedRoute)


def _problem(exc: db.webhooks.WebhookError) -> ProblemError:
    return ProblemError(422, str(exc), [FieldError(field=exc.field, message=exc.message, allowed=exc.allowed)])


@router.post(
    "",
    status_code=201,
    response_model=WebhookCreated,
    responses=WRITE_RESPONSES,
    summary="Register a webhook (the secret is returned once)",
)
def create_webhook(
    body: WebhookCreate, session: SessionDep, settings: SettingsDep, token: AdminAuth, response: Response
) -> Any:
    try:
        hook = db.webhooks.create_webhook(
            session,
            body.url,
            secret=body.secret,
            events=body.events,
            enabled=body.enabled,
            allow_private=settings.webhook_allow_private,
            resolve=system_resolve,
            token_id=token.id,
        )
    except db.webhooks.WebhookError as exc:
        raise _problem(exc) from exc
    session.commit()
    response.headers["Location"] = f"/webhooks/{hook.id}"
    return webhook_read(hook) | {"secret": hook.secret}


@router.get("", response_model=list[WebhookRead], responses=PROBLEM_RESPONSES, summary="List webhooks (token)")
def list_webhooks(session: SessionDep, _auth: AdminAuth) -> Any:
    return [webhook_read(h) for h in db.webhooks.list_webhooks(session)]


@router.patch(
    "/{webhook_id}",
    response_model=WebhookRead,
    responses=WRITE_RESPONSES,
    summary="Enable or disable a webhook, or change its events",
)
def update_webhook(webhook_id: WebhookId, body: WebhookUpdate, session: SessionDep, _auth: AdminAuth) -> Any:
    hook = found(db.webhooks.get_webhook(session, webhook_id), "webhook", webhook_id)
    try:
        db.webhooks.update_webhook(session, hook, enabled=body.enabled, events=body.events)
    except db.webhooks.WebhookError as exc:
        raise _problem(exc) from exc
    session.commit()
    return webhook_read(hook)


@router.delete(
    "/{webhook_id}", status_code=204, responses=PROBLEM_RESPONSES, summary="Delete a webhook and its delivery log"
)
def delete_webhook(webhook_id: WebhookId, session: SessionDep, _auth: AdminAuth) -> Response:
    db.webhooks.delete_webhook(session, found(db.webhooks.get_webhook(session, webhook_id), "webhook", webhook_id))
    session.commit()
    return Response(status_code=204)


@router.get(
    "/{webhook_id}/deliveries",
    response_model=list[DeliveryRead],
    responses=PROBLEM_RESPONSES,
    summary="Delivery log of a webhook, newest first (every attempt with its status code or error; token)",
)
def list_deliveries(
    webhook_id: WebhookId, session: SessionDep, _auth: AdminAuth, limit: Annotated[int, Query(ge=1, le=500)] = 100
) -> Any:
    found(db.webhooks.get_webhook(session, webhook_id), "webhook", webhook_id)
    return db.webhooks.list_deliveries(session, webhook_id, limit)
