"""The REST surface: ``/v1`` over the facade, its OpenAPI document, the dashboard, ``/metrics``,
and the API port's ASGI app that mounts the other surfaces the daemon hands it."""

from .app import make_api_app
from .http import HttpError
from .openapi import openapi_document
from .rest import ROUTES, RestApi

__all__ = ["make_api_app", "RestApi", "ROUTES", "openapi_document", "HttpError"]
