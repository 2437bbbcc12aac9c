"""One router per resource; api.app.ROUTERS lists them."""
